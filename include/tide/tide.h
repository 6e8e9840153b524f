/* tide: the public C ABI of libtide.so.
 *
 * Every function returns a tide_status; on failure, tide_last_error() gives a message that says
 * what failed and why (for a CUDA call: the call's name, the error's name and its text). The
 * message is per thread and stays valid until the thread's next tide call.
 */
#ifndef TIDE_TIDE_H_
#define TIDE_TIDE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_API __attribute__((visibility("default")))

typedef enum tide_status {
  TIDE_OK = 0,
  TIDE_ERROR_INVALID_ARGUMENT = 1, /* a bad argument or TIDE_* variable */
  TIDE_ERROR_NO_DRIVER = 2,        /* no CUDA driver could be loaded */
  TIDE_ERROR_CUDA = 3,             /* a CUDA driver call failed */
  TIDE_ERROR_OUT_OF_MEMORY = 4,
  TIDE_ERROR_INTERNAL = 5
} tide_status;

/* The library's version, "MAJOR.MINOR.PATCH". */
TIDE_API const char* tide_version(void);

/* The message of this thread's last failed call, or "" if none failed. */
TIDE_API const char* tide_last_error(void);

/* Loads the CUDA driver (libcuda.so.1, or the library named by TIDE_CUDA_DRIVER) if not yet
 * loaded, and reports the number of devices and the driver's CUDA version (e.g. 13000). */
TIDE_API tide_status tide_driver_info(int* device_count, int* driver_version);

/* Free and total device memory of `device`, as the driver reports them. */
TIDE_API tide_status tide_device_memory(int device, size_t* free_bytes, size_t* total_bytes);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_TIDE_H_ */
