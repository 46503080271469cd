"""The loop on the GPU (issue 16): the stop driver `gpu_loop` launches the whole generation, every
step and the early stop, as one CUDA graph, and waits once, at the end.

The graph holds a WHILE node (a CUDA conditional node, CUDA 12.4+). Its body is one decode step,
captured, followed by a one-thread kernel that decides whether to run the body again:

    go = not done and left > 0;  if go: left -= 1;  cudaGraphSetConditional(handle, go)

The same kernel runs once before the node, to decide whether to enter it. torch 2.11 has no API
for conditional nodes, so the node is added with NVIDIA's `cuda.bindings` while torch captures, and
the body is captured into the node's own graph on a second stream. The kernel is compiled at run
time with NVRTC. The body must allocate nothing (only the fused step's greedy decode qualifies).
"""
import functools

import numpy as np
import torch

from .stops import LOOP_BODY, Driver

CONDITION = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(
    cudaGraphConditionalHandle handle, unsigned int value);

extern "C" __global__ void fastgen_loop_condition(
        cudaGraphConditionalHandle handle, const bool *done, int *left) {
    bool go = !*done && *left > 0;  // rows to finish, and tokens to make
    if (go) *left -= 1;
    cudaGraphSetConditional(handle, go);
}
"""


def bindings():
    """cuda.bindings' driver, runtime and nvrtc modules, or an error naming what is missing."""
    if not torch.cuda.is_available():
        raise RuntimeError("gpu_loop needs a CUDA GPU")
    try:
        from cuda.bindings import driver, nvrtc, runtime
    except ImportError as e:
        raise RuntimeError("gpu_loop needs NVIDIA's CUDA Python bindings: pip install "
                           f"cuda-bindings ({e})") from e
    version = _check(driver.cuDriverGetVersion())
    if version < 12040:
        raise RuntimeError(f"gpu_loop needs a driver for CUDA 12.4 or later (conditional graph "
                           f"nodes); this one supports {version // 1000}.{version % 1000 // 10}")
    return driver, runtime, nvrtc


def _check(result):
    """A cuda.bindings call's values, or an error if its status is not success."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err}")
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def condition_kernel(device_index):
    """`fastgen_loop_condition`, compiled with NVRTC for this GPU's architecture."""
    driver, _, nvrtc = bindings()
    prog = _check(nvrtc.nvrtcCreateProgram(CONDITION.encode(), b"fastgen_loop.cu", 0, [], []))
    major, minor = torch.cuda.get_device_capability(device_index)
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        log = bytearray(_check(nvrtc.nvrtcGetProgramLogSize(prog)))
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC could not compile the loop's condition: {log.decode()}")
    ptx = bytearray(_check(nvrtc.nvrtcGetPTXSize(prog)))
    _check(nvrtc.nvrtcGetPTX(prog, ptx))
    ptx = np.char.array(bytes(ptx))  # NUL-terminated, at a stable address
    module = _check(driver.cuModuleLoadData(ptx.ctypes.data))
    return _check(driver.cuModuleGetFunction(module, b"fastgen_loop_condition"))


class Loop:
    """One CUDA graph that runs `step` until every row has finished or `left` reaches 0: the
    condition kernel, then a WHILE node whose body is one step and the condition kernel again."""

    def __init__(self, step):
        driver, runtime, _ = bindings()
        dev = step.out.device
        kernel = condition_kernel(dev.index or 0)
        self.left = torch.zeros(1, dtype=torch.int32, device=dev)  # steps still allowed
        # pinned: [0] the steps a call allows, written by the host before the launch; [1] the
        # steps it did not run, copied back by the graph itself
        self.host = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        ptrs = np.array([step.done[0].data_ptr(), self.left.data_ptr()], dtype=np.uint64)
        # the body's stream, a new one: torch.cuda.Stream() comes round-robin from
        # a pool of 32, so it can be the very stream that torch.cuda.graph captures on
        non_blocking = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
        with torch.cuda.device(dev):  # on the step's GPU
            raw = _check(driver.cuStreamCreate(non_blocking))
        inner = torch.cuda.ExternalStream(int(raw), device=dev)
        to_gpu = runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
        to_host = runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            outer = torch.cuda.current_stream()
            copy(self.left, self.host[0], to_gpu, outer)  # the step budget
            _, _, graph, *_ = _check(runtime.cudaStreamGetCaptureInfo(outer.cuda_stream))
            handle = _check(runtime.cudaGraphConditionalHandleCreate(graph, 0, 0))
            # kernel arguments: the address of each argument's value
            args = np.array([handle.getPtr(), ptrs.ctypes.data, ptrs.ctypes.data + 8],
                            dtype=np.uint64)

            def condition(stream):
                _check(driver.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0,  # one thread
                                             stream.cuda_stream, args.ctypes.data, 0))

            condition(outer)  # enter the loop at all?
            _, _, graph, deps, *_ = _check(
                runtime.cudaStreamGetCaptureInfo(outer.cuda_stream))
            params = driver.CUgraphNodeParams()
            params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            params.conditional.handle = handle
            params.conditional.type = (
                driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE)
            params.conditional.size = 1
            params.conditional.ctx = _check(driver.cuCtxGetCurrent())
            node = _check(driver.cuGraphAddNode(graph, deps, None, len(deps), params))
            flags = runtime.cudaStreamUpdateCaptureDependenciesFlags
            _check(runtime.cudaStreamUpdateCaptureDependencies(  # what follows: after it
                outer.cuda_stream, [node], None, 1,
                flags.cudaStreamSetCaptureDependencies))
            body = params.conditional.phGraph_out[0]
            _check(runtime.cudaStreamBeginCaptureToGraph(
                inner.cuda_stream, body, None, None, 0,
                runtime.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal))
            try:
                torch.cuda.set_stream(inner)
                step.run(0)        # one decode step, captured into the loop's body
                condition(inner)   # another one?
            finally:
                _check(runtime.cudaStreamEndCapture(inner.cuda_stream))
                torch.cuda.set_stream(outer)
            copy(self.host[1], self.left, to_host, outer)  # the steps not run
        _check(driver.cuStreamDestroy(raw))
        self._keep = (ptrs, args, kernel)


def copy(dst, src, kind, stream):
    """One int32 from `src` to `dst` (pinned host memory, or the GPU's) as a graph's memcpy node:
    captured on `stream`, it runs at every launch and reads or writes the host memory then."""
    _, runtime, _ = bindings()
    _check(runtime.cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), 4, kind, stream.cuda_stream))


def gpu_loop(step, max_new_tokens, streamer=None):
    """Stop driver, chapter 10: all the steps as one graph launch; the host waits once, at the end,
    and reads how many steps ran from pinned memory. The step must allocate nothing while it runs
    (`stops.LOOP_BODY`, which `decoders.decode` checks). Streaming is refused: the host sees no token
    until the end."""
    if streamer is not None:
        raise ValueError("gpu_loop cannot stream: the host sees no token "
                         "until the end")
    loop = step.__dict__.get("_gpu_loop")
    if loop is None:
        loop = step._gpu_loop = Loop(step)
    loop.host[0] = max_new_tokens - 1  # the prompt's token was the first
    loop.graph.replay()  # the one launch: every step, the stop, the count's copy
    torch.cuda.current_stream().synchronize()  # the one host wait
    return max_new_tokens - int(loop.host[1])


gpu_loop = Driver(gpu_loop, needs=frozenset({LOOP_BODY}), cuda=True, streams=False)
