/* LD_PRELOAD into one rank: each PMIx_Fence_nb completes there LATE_FENCE_US microseconds late,
 * as when that rank's node hears of the fence last. Its PMIx progress thread sleeps in the
 * callback while the rank's main thread keeps polling inside MPI_Init. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int pmix_status_t;
typedef void (*op_cbfunc)(pmix_status_t status, void *cbdata);
typedef pmix_status_t (*fence_nb_fn)(const void *procs, size_t nprocs, const void *info, size_t ninfo,
                                     op_cbfunc cbfunc, void *cbdata);

struct held {
    op_cbfunc cbfunc;
    void *cbdata;
};

static void late(pmix_status_t status, void *arg) {
    struct held *held = arg;
    fprintf(stderr, "late fence: held %s us\n", getenv("LATE_FENCE_US"));
    usleep(atoi(getenv("LATE_FENCE_US")));
    held->cbfunc(status, held->cbdata);
    free(held);
}

pmix_status_t PMIx_Fence_nb(const void *procs, size_t nprocs, const void *info, size_t ninfo, op_cbfunc cbfunc,
                            void *cbdata) {
    /* libpmix came in with mpi4py's module, loaded RTLD_LOCAL: RTLD_NEXT cannot see it */
    fence_nb_fn real = (fence_nb_fn)dlsym(dlopen("libpmix.so.2", RTLD_NOW | RTLD_NOLOAD), "PMIx_Fence_nb");
    if (!getenv("LATE_FENCE_US") || !cbfunc) return real(procs, nprocs, info, ninfo, cbfunc, cbdata);
    struct held *held = malloc(sizeof *held);
    held->cbfunc = cbfunc;
    held->cbdata = cbdata;
    return real(procs, nprocs, info, ninfo, late, held);
}
