"""The traffic formulas of the ops that launch a network's other kernels: norms, losses,
embeddings and indexing, attention and convolution, forward and backward, as data. Pure.

Each op's arguments are read by position, from the tables below (the positions of its functional
schema in ATen's `native_functions.yaml`); an op writes the outputs its schema returns (a
`native_layer_norm` writes its mean and rstd, a `layer_norm` only its output). A flag the formula
needs that was not recorded (`Concrete Inputs` missing: older torch) makes the call unknown.

FLOPs per element of the norms: the statistics and normalisation (`NORM_FLOPS`: rms 3, layer 5:
sum, subtract, square and sum, scale) plus one per affine parameter. Batch and group norm fold
mean, rstd, weight and bias into one scale and shift per channel, as PyTorch's kernels do: 3 per
element for the statistics (training) and 2 to apply them, whatever the affine parameters.
Backward (`NORM_BACKWARD_FLOPS`, 9 for layer, group and batch norm as in PyTorch's CPU kernels:
4 for the dot products, 5 for the gradient; rms norm, with no mean, 6) for the input's gradient,
plus 3 per element for the weight's gradient (recompute x̂, multiply, sum) and 1 for the bias's. Attention counts
its two products (QKᵀ and PV), halved when causal, and 2.5 times that backward (QKᵀ recomputed and
four gradients), as FlashAttention's benchmarks do; softmax is left out as an order of the head
size smaller. A convolution counts 2 per multiply-add, bias excluded, as torch's `with_flops` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .dtypes import Tensor
from .formulas import Call, Cost, broadcast


@dataclass(frozen=True)
class Norm:
    kind: str  # "layer", "rms", "batch", "group"
    weight: int | None
    bias: int | None
    stats: bool = False  # writes its statistics (the native ops)
    training: int | None = None  # batch norm: the position of `training`
    running: tuple = ()  # batch norm: running_mean, running_var (read, and written when training)
    groups: int | None = None  # group norm: the position of the group count


NORMS = {
    "native_layer_norm": Norm("layer", 2, 3, stats=True), "layer_norm": Norm("layer", 2, 3),
    "_fused_rms_norm": Norm("rms", 2, None, stats=True), "rms_norm": Norm("rms", 2, None),
    "native_batch_norm": Norm("batch", 1, 2, stats=True, training=5, running=(3, 4)),
    "miopen_batch_norm": Norm("batch", 1, 2, stats=True, training=5, running=(3, 4)),
    "cudnn_batch_norm": Norm("batch", 1, 2, stats=True, training=5, running=(3, 4)),
    "batch_norm": Norm("batch", 1, 2, training=5, running=(3, 4)),
    "native_group_norm": Norm("group", 1, 2, stats=True, groups=6), "group_norm": Norm("group", 2, 3, groups=1),
}  # fmt: skip
NORM_FLOPS = {"layer": 5, "rms": 3, "group": 5, "batch": 5}
FOLDED = {"batch", "group"}  # affine parameters folded into a per-channel scale and shift


@dataclass(frozen=True)
class NormBackward:
    kind: str
    grad: int
    input: int
    saved: tuple  # the saved statistics, read
    weight: int | None
    bias: int | None  # a tensor whose shape the bias's gradient has (never read)
    mask: int | None  # output_mask; None: every gradient is computed
    training: int | None = None


NORM_BACKWARDS = {
    "native_layer_norm_backward": NormBackward("layer", 0, 1, (3, 4), 5, 6, 7),
    "_fused_rms_norm_backward": NormBackward("rms", 0, 1, (3,), 4, None, 5),
    "native_batch_norm_backward": NormBackward("batch", 0, 1, (5, 6), 2, 2, 9, training=7),
    "miopen_batch_norm_backward": NormBackward("batch", 1, 0, (5, 6), 2, 2, None),
    "cudnn_batch_norm_backward": NormBackward("batch", 1, 0, (5, 6), 2, 2, None),
    "native_group_norm_backward": NormBackward("group", 0, 1, (2, 3), 4, 4, 9),
}  # fmt: skip
NORM_BACKWARD_FLOPS = {"layer": 9, "rms": 6, "group": 9, "batch": 9}


def _acc(dtype: str) -> str:
    """The accumulation dtype norm statistics are kept in."""
    return "double" if dtype == "double" else "float"


def norm(call: Call) -> Cost | None:
    spec = NORMS[call.name]
    x = call.tensor(0)
    if x is None or not x.shape:
        return None
    params = [t for t in (call.tensor(spec.weight), call.tensor(spec.bias)) if t is not None]
    read = x.nbytes + sum(t.nbytes for t in params)
    written = x.nbytes
    per_element = NORM_FLOPS[spec.kind] + (0 if spec.kind in FOLDED else len(params))
    if spec.kind == "batch":
        training = call.flag(spec.training)
        if training is None or len(x.shape) < 2:
            return None
        running = [t for t in map(call.tensor, spec.running) if t is not None]
        read += sum(t.nbytes for t in running)
        written += sum(t.nbytes for t in running) if training else 0
        per_element -= 0 if training else 3
        stats = 2 * x.shape[1] if training else 0
    elif spec.kind == "group":
        groups = call.ints(spec.groups)
        if not groups or len(x.shape) < 2:
            return None
        stats = 2 * x.shape[0] * groups[0]
    elif spec.stats:
        weight = call.tensor(spec.weight)  # has the normalized shape (checked by torch): older torch records no list
        normalized = call.ints(1) if call.kinds[1:2] == ("ScalarList",) or weight is None else list(weight.shape)
        if normalized is None or len(normalized) > len(x.shape):
            return None
        stats = math.prod(x.shape[: len(x.shape) - len(normalized)]) * (2 if spec.kind == "layer" else 1)
    if spec.stats:
        stats_dtype = x.dtype if spec.kind == "group" else _acc(x.dtype)
        written += Tensor((stats,), stats_dtype).nbytes
    return Cost(read, written, per_element * x.numel)


def norm_backward(call: Call) -> Cost | None:
    spec = NORM_BACKWARDS[call.name]
    grad, x = call.tensor(spec.grad), call.tensor(spec.input)
    if grad is None or x is None:
        return None
    mask = [True, True, True] if spec.mask is None else _mask(call.text(spec.mask))
    if mask is None:
        return None
    weight, bias = call.tensor(spec.weight), call.tensor(spec.bias)
    saved = [t for t in map(call.tensor, spec.saved) if t is not None]
    read = grad.nbytes + x.nbytes + sum(t.nbytes for t in saved) + (weight.nbytes if weight is not None else 0)
    written, flops = 0, 0
    if mask[0]:
        written += x.nbytes
        training = True if spec.training is None else call.flag(spec.training)
        flops += (NORM_BACKWARD_FLOPS[spec.kind] if training is not False else 2) * x.numel
    if mask[1] and weight is not None:
        written, flops = written + weight.nbytes, flops + 3 * x.numel
    if mask[2] and bias is not None:
        written, flops = written + bias.nbytes, flops + x.numel
    return Cost(read, written, flops)


def _mask(text: str) -> list[bool] | None:
    """An `output_mask` ("[True, False]" or of three), as three flags; None when not recorded."""
    mask = [{"True": True, "False": False}.get(t.strip()) for t in text.strip("[]").split(",")]
    return None if None in mask or len(mask) not in (2, 3) else mask + [False] * (3 - len(mask))


def mse_loss(call: Call) -> Cost | None:
    """mse_loss(self, target, reduction): reduction 0 keeps the elements, 1 (mean) and 2 (sum) give one."""
    x, target = call.tensor(0), call.tensor(1)
    reduction = call.text(2)
    if x is None or target is None or reduction not in ("0", "1", "2"):
        return None
    shape = broadcast([x.shape, target.shape])
    if shape is None:
        return None
    out = Tensor(tuple(shape) if reduction == "0" else (), x.dtype)
    return Cost(x.nbytes + target.nbytes, out.nbytes, 3 * math.prod(shape))


def nll_loss(call: Call) -> Cost | None:
    """nll_loss_forward(self, target, weight, reduction, ignore_index): one element of self read per
    target (a gather), the loss and total_weight written; backward(grad_output, self, target, weight,
    reduction, ignore_index, total_weight): grad_input (self's shape) written."""
    backward = call.name.endswith("_backward")
    x, target = call.tensor(1 if backward else 0), call.tensor(2 if backward else 1)
    reduction = call.text(4 if backward else 3)
    if x is None or target is None or reduction not in ("0", "1", "2"):
        return None
    weight = call.tensor(3 if backward else 2)
    gathered = Tensor(target.shape, x.dtype)
    read = target.nbytes + gathered.nbytes + (weight.nbytes if weight is not None else 0)
    if backward:
        return Cost(read, x.nbytes, target.numel)
    out = Tensor(target.shape if reduction == "0" else (), x.dtype)
    return Cost(read, out.nbytes + Tensor((), x.dtype).nbytes, target.numel)


def gather_rows(call: Call) -> Cost | None:
    """embedding(weight, indices), index_select(self, dim, index), gather(self, dim, index): the
    indices and the rows they pick are read (not the whole table), the result written."""
    if call.name == "embedding":
        table, index, dim = call.tensor(0), call.tensor(1), 0
    else:
        table, index, dims = call.tensor(0), call.tensor(2), call.ints(1)
        dim = dims[0] if dims else None
    if table is None or index is None or dim is None or not table.shape:
        return None
    dim %= len(table.shape)
    if call.name == "embedding":
        shape = (*index.shape, *table.shape[1:])
    elif call.name == "index_select":
        shape = (*table.shape[:dim], index.numel, *table.shape[dim + 1:])
    else:
        shape = index.shape
    out = Tensor(shape, table.dtype)
    return Cost(index.nbytes + out.nbytes, out.nbytes, 0)


def embedding_backward(call: Call) -> Cost | None:
    """embedding_dense_backward(grad_output, indices, num_weights, ...): the gradient table written."""
    grad, index, rows = call.tensor(0), call.tensor(1), call.ints(2)
    if grad is None or index is None or not rows or not grad.shape:
        return None
    return Cost(grad.nbytes + index.nbytes, Tensor((rows[0], grad.shape[-1]), grad.dtype).nbytes, grad.numel)


@dataclass(frozen=True)
class Attention:
    heads_first: bool  # [B, H, L, E] (else [B, L, H, E])
    causal: int  # position of is_causal (or custom_mask_type, when `mask_type`)
    backward: bool = False
    first: int = 0  # position of the query (backward: of grad_out, the query after it)
    varlen: int | None = None  # cumulative sequence lengths: a tensor there means packed sequences
    extra: tuple = ()  # other tensors read: out, logsumexp, a bias or mask
    lse: int | None = None  # forward: position of compute_log_sumexp (-1: always written)
    mask_type: bool = False


ATTENTION = {
    "scaled_dot_product_attention": Attention(True, 5, extra=(3,)),
    "_scaled_dot_product_flash_attention": Attention(True, 4, lse=-1),
    "_scaled_dot_product_flash_attention_for_cpu": Attention(True, 4, extra=(5,), lse=-1),
    "_scaled_dot_product_efficient_attention": Attention(True, 6, extra=(3,), lse=4),
    "_scaled_dot_product_cudnn_attention": Attention(True, 6, extra=(3,), lse=4),
    "_flash_attention_forward": Attention(False, 8, varlen=3, lse=-1),
    "_efficient_attention_forward": Attention(False, 9, varlen=4, extra=(3,), lse=10, mask_type=True),
    "_scaled_dot_product_flash_attention_backward": Attention(True, 11, True, varlen=6, extra=(4, 5)),
    "_scaled_dot_product_flash_attention_for_cpu_backward": Attention(True, 7, True, extra=(4, 5, 8)),
    "_flash_attention_backward": Attention(False, 11, True, varlen=6, extra=(4, 5)),
    "_scaled_dot_product_efficient_attention_backward": Attention(True, 11, True, extra=(4, 5, 6)),
    "_efficient_attention_backward": Attention(False, 14, True, varlen=6, extra=(4, 5, 10), mask_type=True),
    "_scaled_dot_product_cudnn_attention_backward": Attention(True, 14, True, varlen=9, extra=(4, 5, 8)),
}  # fmt: skip


def attention(call: Call) -> Cost | None:
    spec = ATTENTION[call.name]
    start = 1 if spec.backward else 0
    q, k, v = (call.tensor(start + i) for i in range(3))
    if q is None or k is None or v is None or len({len(q.shape), len(k.shape), len(v.shape), 4}) != 1:
        return None
    if spec.varlen is not None and call.tensor(spec.varlen) is not None:
        return None  # packed sequences: their lengths are in a tensor the profiler does not record
    seq = 2 if spec.heads_first else 1
    (b, l, e), (s, ev) = (q.shape[0], q.shape[seq], q.shape[3]), (k.shape[seq], v.shape[3])
    heads = q.shape[3 - seq]
    causal = call.text(spec.causal) not in ("0", "") if spec.mask_type else call.flag(spec.causal)
    if causal is None or (causal and l != s):
        return None  # unrecorded, or a causal mask whose alignment differs between backends
    flops = 2 * b * heads * l * s * (e + ev) // (2 if causal else 1)
    extra = sum(t.nbytes for t in map(call.tensor, spec.extra) if t is not None)
    if spec.backward:
        grad = call.tensor(0)
        read = (grad.nbytes if grad is not None else 0) + q.nbytes + k.nbytes + v.nbytes + extra
        return Cost(read, q.nbytes + k.nbytes + v.nbytes, flops * 5 // 2)
    out = Tensor((b, heads, l, ev), q.dtype)
    lse = spec.lse is not None and (spec.lse < 0 or call.flag(spec.lse) is True)
    return Cost(q.nbytes + k.nbytes + v.nbytes + extra, out.nbytes + (4 * b * heads * l if lse else 0), flops)


# Positions of (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
# None: absent (bias), 1 (stride, dilation, groups), 0 (output_padding), False (transposed).
CONVOLUTIONS = {
    "convolution": (0, 1, 2, 3, 4, 5, 6, 7, 8), "_convolution": (0, 1, 2, 3, 4, 5, 6, 7, 8),
    "conv1d": (0, 1, 2, 3, 4, 5, None, None, 6), "conv2d": (0, 1, 2, 3, 4, 5, None, None, 6),
    "conv3d": (0, 1, 2, 3, 4, 5, None, None, 6), "cudnn_convolution": (0, 1, None, 3, 2, 4, None, None, 5),
    "miopen_convolution": (0, 1, 2, 4, 3, 5, None, None, 6), "mkldnn_convolution": (0, 1, 2, 4, 3, 5, None, None, 6),
    "convolution_backward": (1, 2, None, 4, 5, 6, 7, 8, 9),
}  # fmt: skip


def _conv_geometry(call: Call, spec: tuple) -> tuple[tuple, int] | None:
    """(output shape, FLOPs) of a convolution's forward."""
    x, w = call.tensor(spec[0]), call.tensor(spec[1])
    if x is None or w is None or len(x.shape) != len(w.shape) or len(x.shape) < 3:
        return None
    dims = len(x.shape) - 2

    def listed(position, default):
        if position is None:
            return [default] * dims
        found = call.ints(position)
        return None if found is None else (found * dims if len(found) == 1 else found)

    stride, padding, dilation, out_pad = listed(spec[3], 1), listed(spec[4], 0), listed(spec[5], 1), listed(spec[7], 0)
    groups = listed(spec[8], 1)
    transposed = False if spec[6] is None else call.flag(spec[6])
    if None in (stride, padding, dilation, out_pad, groups, transposed) or len(stride) != dims:
        return None
    groups, kernel = groups[0], w.shape[2:]
    spatial = []
    for size, k, s, p, d, o in zip(x.shape[2:], kernel, stride, padding, dilation, out_pad):
        spatial.append((size - 1) * s - 2 * p + d * (k - 1) + o + 1 if transposed else (size + 2 * p - d * (k - 1) - 1) // s + 1)
    c_out = w.shape[1] * groups if transposed else w.shape[0]
    out = (x.shape[0], c_out, *spatial)
    macs = x.shape[0] * math.prod(x.shape[2:] if transposed else spatial) * w.shape[0] * w.shape[1] * math.prod(kernel)
    return out, 2 * macs


def convolution(call: Call) -> Cost | None:
    spec = CONVOLUTIONS[call.name]
    found = _conv_geometry(call, spec)
    if found is None:
        return None
    shape, flops = found
    x, w, bias = call.tensor(spec[0]), call.tensor(spec[1]), call.tensor(spec[2]) if spec[2] is not None else None
    if call.name != "convolution_backward":
        read = x.nbytes + w.nbytes + (bias.nbytes if bias is not None else 0)
        return Cost(read, Tensor(shape, x.dtype).nbytes, flops)
    grad, mask = call.tensor(0), _mask(call.text(10))
    if grad is None or mask is None:
        return None
    written = (x.nbytes if mask[0] else 0) + (w.nbytes if mask[1] else 0) + (Tensor((shape[1],), grad.dtype).nbytes if mask[2] else 0)
    return Cost(grad.nbytes + x.nbytes + w.nbytes, written, flops * (mask[0] + mask[1]) + (grad.numel if mask[2] else 0))


FORMULAS_NN: dict[str, Callable[[Call], Cost | None]] = {
    **{op: norm for op in NORMS}, **{op: norm_backward for op in NORM_BACKWARDS},
    "mse_loss": mse_loss, "nll_loss_forward": nll_loss, "nll_loss_backward": nll_loss,
    "nll_loss2d_forward": nll_loss, "nll_loss2d_backward": nll_loss,
    "embedding": gather_rows, "index_select": gather_rows, "gather": gather_rows,
    "embedding_dense_backward": embedding_backward,
    **{op: attention for op in ATTENTION}, **{op: convolution for op in CONVOLUTIONS},
}  # fmt: skip
