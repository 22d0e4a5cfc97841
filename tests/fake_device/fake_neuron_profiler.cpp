// Fake "neuron" accelerator profiler for tests: a Kineto child profiler that
// torch registers for the PrivateUse1 slot (REGISTER_PRIVATEUSE1_PROFILER runs
// from this library's static initializer, so loading the .so is enough).
//
// There is no device. Torch pushes a correlation id to every Kineto session
// for each op it records; after the trace stops, Kineto hands us a callback
// that maps a correlation id back to the recorded CPU op. We use that to learn
// the op's name and timestamp (so no RecordFunction hook of our own is needed)
// and invent one activity per configured op, linked to it.
//
// Configuration (read in configure(), i.e. once per profiling cycle):
//   FAKE_NEURON_KERNELS="aten::mul=700,aten::add=50"  op name -> duration (us)
//   FAKE_NEURON_MODE=kernels (default) | runtime
//     kernels: CONCURRENT_KERNEL "neuron_kernel::<op>" with the given duration,
//              queued back to back on fake stream 0 of device 0.
//     runtime: host-side PRIVATEUSE1_RUNTIME "neuron_runtime::<op>" over the
//              middle half of the op, PRIVATEUSE1_DRIVER "neuron_driver::<op>"
//              over its middle quarter (durations ignored); torch reports no
//              device time for these.
//   Noise, for calibrating comparisons (kernels mode; all default off):
//   FAKE_NEURON_JITTER=0.3        each kernel's duration times U(1-0.3, 1+0.3)
//   FAKE_NEURON_STALL_RATE=0.02   chance that a kernel stalls ...
//   FAKE_NEURON_STALL_FACTOR=10   ... and takes this many times longer
//   FAKE_NEURON_SEED=7            seeds the noise; each cycle of a process draws
//                                 from the next seed (seed + cycle index), so a
//                                 run is reproducible and its cycles differ.
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <libkineto.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <random>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace {
using namespace libkineto;

std::atomic<uint64_t> cycles_configured{0};

double envDouble(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

struct FakeConfig {
  std::unordered_map<std::string, int64_t> kernel_us;
  bool runtime_mode = false;
  double jitter = 0.0, stall_rate = 0.0, stall_factor = 10.0;
  uint64_t seed = 0;

  static FakeConfig fromEnv() {
    FakeConfig c;
    if (const char* m = std::getenv("FAKE_NEURON_MODE")) {
      c.runtime_mode = std::string(m) == "runtime";
    }
    c.jitter = envDouble("FAKE_NEURON_JITTER", 0.0);
    c.stall_rate = envDouble("FAKE_NEURON_STALL_RATE", 0.0);
    c.stall_factor = envDouble("FAKE_NEURON_STALL_FACTOR", 10.0);
    c.seed = static_cast<uint64_t>(envDouble("FAKE_NEURON_SEED", 0.0)) + cycles_configured.fetch_add(1);
    // Split on ',' then on the *last* '=' (op names contain "::", never '=').
    std::stringstream all(std::getenv("FAKE_NEURON_KERNELS") ? std::getenv("FAKE_NEURON_KERNELS") : "");
    std::string item;
    while (std::getline(all, item, ',')) {
      auto eq = item.rfind('=');
      if (eq == std::string::npos || eq == 0) continue;
      c.kernel_us[item.substr(0, eq)] = std::atoll(item.c_str() + eq + 1);
    }
    return c;
  }
};

class FakeNeuronSession : public IActivityProfilerSession {
 public:
  FakeNeuronSession(FakeConfig cfg, bool enabled) : cfg_(std::move(cfg)), enabled_(enabled) {}

  void start() override {
    std::lock_guard<std::mutex> g(mu_);
    recording_ = true;
    status_ = TraceStatus::RECORDING;
  }
  void stop() override {
    std::lock_guard<std::mutex> g(mu_);
    recording_ = false;
    status_ = TraceStatus::PROCESSING;
  }

  // Called on whichever thread runs the op, hence the mutex. Names are not
  // known yet (only torch knows them), so just remember the id.
  void pushCorrelationId(uint64_t id) override {
    std::lock_guard<std::mutex> g(mu_);
    if (recording_ && enabled_) ids_.push_back(id);
  }

  std::vector<std::string> errors() override { return {}; }

  // Without the linked-activity callback we cannot resolve ids to ops.
  void processTrace(ActivityLogger&) override {}

  void processTrace(ActivityLogger& logger, getLinkedActivityCallback linked,
                    int64_t startTime, int64_t endTime) override {
    buf_ = std::make_unique<CpuTraceBuffer>();
    buf_->span = TraceSpan(startTime, endTime, "neuron");
    buf_->gpuOpCount = 0;

    std::vector<const ITraceActivity*> ops;
    for (auto id : ids_) {
      const ITraceActivity* op = linked(static_cast<int32_t>(id));
      if (op && cfg_.kernel_us.count(op->name())) ops.push_back(op);
    }
    // Ops from several threads: a device executes in launch order.
    std::stable_sort(ops.begin(), ops.end(),
                     [](auto* a, auto* b) { return a->timestamp() < b->timestamp(); });

    int64_t stream_free_at = 0;  // fake stream: kernels never overlap
    std::mt19937_64 rng(cfg_.seed);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (const ITraceActivity* op : ops) {
      double scale = 1.0;
      if (cfg_.jitter > 0) scale *= 1.0 + cfg_.jitter * (2.0 * unit(rng) - 1.0);
      if (cfg_.stall_rate > 0 && unit(rng) < cfg_.stall_rate) scale *= cfg_.stall_factor;
      const int64_t dur_ns = std::llround(cfg_.kernel_us.at(op->name()) * 1000 * scale);
      if (cfg_.runtime_mode) {
        // Nested strictly inside the op so the CPU tree stays well formed and
        // the op keeps some self CPU time.
        const int64_t s = op->timestamp(), q = op->duration() / 8;
        add(logger, op, ActivityType::PRIVATEUSE1_RUNTIME, "neuron_runtime::", s + 2 * q, s + 6 * q, true);
        add(logger, op, ActivityType::PRIVATEUSE1_DRIVER, "neuron_driver::", s + 3 * q, s + 5 * q, true);
      } else {
        const int64_t s = std::max(op->timestamp(), stream_free_at);
        stream_free_at = s + dur_ns;
        add(logger, op, ActivityType::CONCURRENT_KERNEL, "neuron_kernel::", s, s + dur_ns, false);
      }
    }
  }

  std::unique_ptr<DeviceInfo> getDeviceInfo() override {
    return std::make_unique<DeviceInfo>(DeviceInfo{kDevice, kDevice, "neuron 0", "NEURON"});
  }
  std::vector<ResourceInfo> getResourceInfos() override {
    return {ResourceInfo{kStream, kStream, kDevice, "fake stream 0"}};
  }
  // Kineto takes the activities' ownership after processTrace; the
  // activities' `linked` pointers stay valid because Kineto owns the ops too.
  std::unique_ptr<CpuTraceBuffer> getTraceBuffer() override { return std::move(buf_); }

 private:
  static constexpr int32_t kDevice = 0, kStream = 0;

  void add(ActivityLogger& logger, const ITraceActivity* op, ActivityType type,
           const std::string& prefix, int64_t start, int64_t end, bool on_host) {
    buf_->emplace_activity(buf_->span, type, prefix + op->name());
    GenericTraceActivity& a = *buf_->activities.back();
    a.startTime = start;
    a.endTime = end;
    // Torch turns `linked` into the parent CPU op (linked_correlation_id),
    // which is what attaches kernels to FunctionEvent.kernels.
    a.linked = op;
    a.id = static_cast<int32_t>(op->correlationId());
    // Host activities live on the op's process/thread row, kernels on the device.
    a.device = on_host ? static_cast<int32_t>(op->deviceId()) : kDevice;
    a.resource = on_host ? static_cast<int32_t>(op->resourceId()) : kStream;
    a.threadId = on_host ? op->getThreadId() : kStream;
    a.log(logger);
  }

  FakeConfig cfg_;
  bool enabled_;
  std::mutex mu_;
  bool recording_ = false;
  std::vector<uint64_t> ids_;
  std::unique_ptr<CpuTraceBuffer> buf_;
};

class FakeNeuronProfiler : public IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return types_; }

  std::unique_ptr<IActivityProfilerSession> configure(const std::set<ActivityType>& requested,
                                                      const Config&) override {
    FakeConfig cfg = FakeConfig::fromEnv();
    // Only emit what the user asked for (ProfilerActivity.PrivateUse1 maps to
    // these Kineto types; a CPU-only profile must stay free of fake kernels).
    const ActivityType want = cfg.runtime_mode ? ActivityType::PRIVATEUSE1_RUNTIME
                                               : ActivityType::CONCURRENT_KERNEL;
    const bool enabled = requested.count(want) > 0;
    return std::make_unique<FakeNeuronSession>(std::move(cfg), enabled);
  }
  std::unique_ptr<IActivityProfilerSession> configure(int64_t, int64_t, const std::set<ActivityType>& t,
                                                      const Config& c) override {
    return configure(t, c);
  }

 private:
  std::string name_{"fake_neuron"};
  std::set<ActivityType> types_{ActivityType::CONCURRENT_KERNEL, ActivityType::PRIVATEUSE1_RUNTIME,
                                ActivityType::PRIVATEUSE1_DRIVER};
};
}  // namespace

REGISTER_PRIVATEUSE1_PROFILER(FakeNeuronProfiler);
