/* The CPU tier's stand-in for the one CUDA runtime call mcr makes through the library itself:
   cudaThreadExchangeStreamCaptureMode (mcr.threads.relax_capture_mode), per thread as CUDA keeps
   it. tests/streams/cuda_model.py builds it as libcudart-model.so and asks each thread's mode. */
static __thread int capture_mode = 0; /* cudaStreamCaptureModeGlobal */

int cudaThreadExchangeStreamCaptureMode(int *mode) {
    int previous = capture_mode;
    capture_mode = *mode;
    *mode = previous;
    return 0; /* cudaSuccess */
}

int model_thread_capture_mode(void) { return capture_mode; }
