// ops::record / ops::can_record (step_recording.h): CUDA graphs through ATen's CUDAGraph where this
// build has CUDA, nothing elsewhere.
#include "step_recording.h"

#if LOWBIT_WITH_CUDA && !defined(USE_ROCM)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define LOWBIT_CAN_RECORD 1
#else
#define LOWBIT_CAN_RECORD 0
#endif

namespace lowbit {
namespace ops {

#if LOWBIT_CAN_RECORD

namespace {

class CudaRecording final : public Recording {
 public:
  at::cuda::CUDAGraph graph;
  void replay() override { graph.replay(); }
};

}  // namespace

bool can_record(const at::Device& device) {
  if (!device.is_cuda()) return false;
  const c10::cuda::CUDAGuard guard(device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream().stream(), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status == cudaStreamCaptureStatusNone;
}

std::unique_ptr<Recording> record(const at::Device& device, const std::function<void()>& enqueue) {
  TORCH_CHECK(can_record(device), "lowbit: cannot record work on ", device,
              " (not a CUDA device, or its current stream is being captured)");
  const c10::cuda::CUDAGuard guard(device);
  auto rec = std::make_unique<CudaRecording>();
  // A graph is captured on a stream of its own (never the default stream), and replayed on
  // whichever stream is current then. Thread-local capture: other threads' CUDA calls (a data
  // loader's allocations) go on as usual meanwhile.
  const c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool(false, device.index()));
  rec->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
  try {
    enqueue();
  } catch (...) {
    try {
      rec->graph.capture_end();  // ends the capture and the pool's recording; the graph is dropped
    } catch (...) {
    }
    throw;
  }
  rec->graph.capture_end();
  return rec;
}

#else

bool can_record(const at::Device&) { return false; }

std::unique_ptr<Recording> record(const at::Device& device, const std::function<void()>&) {
  TORCH_CHECK(false, "lowbit: this build cannot record work on ", device);
}

#endif

}  // namespace ops
}  // namespace lowbit
