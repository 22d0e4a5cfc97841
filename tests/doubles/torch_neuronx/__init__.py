"""Test double of TorchNeuron's `torch_neuronx` package: only the profiling API (tests only)."""
