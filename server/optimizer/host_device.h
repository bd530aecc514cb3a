// DEPOT_HOST_DEVICE marks the element math that the GPU kernels share with the
// server (optimizer_math.h, slot_storage.h): under nvcc it is
// `__host__ __device__`, so CUDA code can call the same source on the device;
// for every other compiler it is empty, so the server's build compiles exactly
// the code it did without it (its golden tests compare bits).
#ifndef DEPOT_SERVER_OPTIMIZER_HOST_DEVICE_H_
#define DEPOT_SERVER_OPTIMIZER_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define DEPOT_HOST_DEVICE __host__ __device__
#else
#define DEPOT_HOST_DEVICE
#endif

#endif  // DEPOT_SERVER_OPTIMIZER_HOST_DEVICE_H_
