/* The parameter server's client library, with a C ABI: one worker of a
 * data-parallel job, for a training loop written in any language that can
 * call C (the `ps` Python package calls it through ctypes). It links no
 * Python and no PyTorch; behind it is the worker daemon's own client
 * (worker/parameter_store.h): sharding over several servers, chunked
 * messages, compression, sync/async/ssp consistency, reconnection, shared
 * memory with a server on the same host. docs/client.md shows it in use.
 *
 * The protocol, per iteration t (from the version register returns):
 *   push segments [first, last) of this worker's gradient for iteration t,
 *     as each bucket of them is ready (asynchronous: a handle);
 *   pull the same segments of version t + 1 (asynchronous: a handle; the
 *     server answers once every worker's push of them is applied);
 *   wait on the handles; the flat buffer then holds version t + 1.
 * Buffers are flat host arrays of float in the order of the tensors given
 * to register; a segment is a range of them (ps_client_segment_ends), the
 * unit a push or pull moves.
 *
 * Errors: every call that can fail returns a ps_status: 0 (PS_OK) or one of
 * absl's canonical codes below, and, when `error` is not NULL, fills it with
 * the same code and a message naming the problem (the call, the argument,
 * the tensor, the server). Nothing aborts the process on bad input or a
 * failing network. A NULL pointer where a value is required is
 * PS_INVALID_ARGUMENT naming the argument; a call out of order (a push
 * before register, register twice) PS_FAILED_PRECONDITION.
 *
 * Threads: every call is thread-safe, and none waits for another caller's
 * call to end: a call that would overlap one it must not returns
 * PS_FAILED_PRECONDITION naming it instead. The blocking calls
 * (register, reconnect, wait_for_version, pull_all: "exclusive") run one at
 * a time and only with no push or pull in flight; ps_client_members is
 * blocking but may overlap pushes and pulls; pushes and pulls may be
 * started from any threads at once, but not while an exclusive call runs.
 * The network work runs on the library's own threads; the caller's thread
 * only waits in the blocking calls and in ps_handle_wait.
 *
 * Ownership: the library copies every string and array it is given before
 * the call returns, except the float buffers of pushes and pulls, which it
 * reads (push) or writes (pull) in place from its threads until the
 * operation's handle is done: until then the caller keeps the buffer alive
 * and leaves the segments concerned alone.
 *
 * ABI: C99 types only; opaque handles; structs the caller allocates carry no
 * pointer the library keeps. PS_CLIENT_ABI_VERSION changes whenever a
 * struct's layout or a function's meaning changes; ps_options_init refuses
 * a caller built for another version. */

#ifndef PS_WORKER_CLIENT_PS_CLIENT_H_
#define PS_WORKER_CLIENT_PS_CLIENT_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PS_CLIENT_ABI_VERSION 2

/* absl::StatusCode's values. */
typedef int32_t ps_status;
#define PS_OK 0
#define PS_CANCELLED 1
#define PS_UNKNOWN 2
#define PS_INVALID_ARGUMENT 3
#define PS_DEADLINE_EXCEEDED 4
#define PS_NOT_FOUND 5
#define PS_ALREADY_EXISTS 6
#define PS_PERMISSION_DENIED 7
#define PS_RESOURCE_EXHAUSTED 8
#define PS_FAILED_PRECONDITION 9
#define PS_ABORTED 10
#define PS_OUT_OF_RANGE 11
#define PS_UNIMPLEMENTED 12
#define PS_INTERNAL 13
#define PS_UNAVAILABLE 14
#define PS_DATA_LOSS 15
#define PS_UNAUTHENTICATED 16

/* A call's outcome: `code` is the call's return value, `message` a
 * NUL-terminated text (empty on PS_OK), cut at PS_ERROR_MESSAGE_SIZE - 1
 * bytes with "..." at its end when longer. */
#define PS_ERROR_MESSAGE_SIZE 2048
typedef struct ps_error {
  int32_t code;
  char message[PS_ERROR_MESSAGE_SIZE];
} ps_error;

/* Element types, common/dtype.h's values. The server takes PS_DTYPE_F32. */
#define PS_DTYPE_F32 0
#define PS_DTYPE_F16 1
#define PS_DTYPE_BF16 2
#define PS_DTYPE_I32 3
#define PS_DTYPE_I64 4

/* A line the library logs (register's and reconnect's retries, stall
 * reports while this worker waits for others, a server that cannot map
 * shared memory), called from the caller's thread during a blocking call
 * or from the library's heartbeat thread; never concurrently with itself
 * for one client. `line` is valid during the call only. */
typedef void (*ps_log_function)(void* context, const char* line);

/* How to reach the job. Fill with ps_options_init, then set fields.
 * Strings are NUL-terminated and copied by ps_client_connect; NULL is the
 * same as "". Durations are milliseconds. */
typedef struct ps_options {
  /* Set by ps_options_init: the ABI the caller was built for. */
  int32_t abi_version;
  /* "host:port", or the shards' "host:port,host:port,..." in the same order
   * on every worker. Required. */
  const char* servers;
  /* Stable per worker (a worker that comes back with it gets its rank
   * back); "": hostname-pid. */
  const char* worker_id;
  /* The rank to ask for; -1 (default): any free one. */
  int32_t rank;
  /* TCP connections per server for pushes, and as many for pulls (1). */
  int32_t connections;
  /* "none" (default, fp32), "fp16", "bf16" or "topk:F" (docs/compression.md). */
  const char* compression;
  /* Non-zero: on a server's host, move tensor bytes through shared memory
   * (falls back to TCP, logging why, where the server cannot map it). */
  int32_t shared_memory;
  /* How long register keeps trying to reach the server (60000). */
  int64_t connect_timeout_ms;
  /* Each push message's deadline, and a blocking pull's (60000). */
  int64_t rpc_timeout_ms;
  /* How long a pull or wait_for_version waits for the slowest worker
   * (600000). */
  int64_t wait_timeout_ms;
  /* How long reconnect waits for a lost server to come back (300000). */
  int64_t reconnect_timeout_ms;
  /* A heartbeat this often once registered (2000); 0: none. */
  int64_t heartbeat_interval_ms;
  /* TLS (docs/security.md): the CA of the server's certificate (""
   * plaintext), a client certificate and key for mutual TLS, the name the
   * server's certificate carries when not the host dialed. */
  const char* tls_ca_file;
  const char* tls_cert_file;
  const char* tls_key_file;
  const char* tls_server_name;
  /* The job token: read from job_token_file when set, else job_token (the
   * value, e.g. what the caller read from $PS_JOB_TOKEN; the library reads
   * no environment); both "": none. */
  const char* job_token;
  const char* job_token_file;
  /* Where log lines go; NULL: stderr, each prefixed "ps_client: ". */
  ps_log_function log;
  void* log_context;
  /* This worker's identity secret (docs/security.md, "Worker identity"):
   * read from this file, made there (mode 0600) when missing. Restarted
   * with it, the worker takes back at once the rank worker_id holds; "":
   * a secret of this client's own, so a restarted process waits until the
   * server declares the old one lost. (ABI 2) */
  const char* identity_file;
} ps_options;

/* One tensor of the model, in the flat buffers' order. */
typedef struct ps_tensor_spec {
  const char* name;     /* unique, non-empty (PyTorch's "fc1.weight") */
  const int64_t* shape; /* ndim dimensions, each >= 0; may be NULL when ndim is 0 */
  int32_t ndim;         /* 0 (a scalar) to PS_MAX_NDIM */
  int32_t dtype;        /* PS_DTYPE_F32 */
} ps_tensor_spec;
#define PS_MAX_NDIM 16

/* The job's settings, as the last register or reconnect set them. */
#define PS_CONSISTENCY_SIZE 32
#define PS_OPTIMIZER_SIZE 16
typedef struct ps_registration {
  int32_t rank;        /* this worker's */
  int32_t num_workers; /* in the job */
  int64_t version;     /* the version to pull first (and the next iteration under sync) */
  /* The server's consistency: "sync", "async" or "ssp:S" (docs/consistency.md). */
  char consistency[PS_CONSISTENCY_SIZE];
  int64_t staleness_bound;   /* ssp:S's S; 0 otherwise */
  int32_t independent_steps; /* async: this worker counts its own iterations from 0 */
  int32_t exact_pulls;       /* a pull of version v brings exactly v (sync, ssp:0) */
  /* The members may change between iterations (the server shrinks the job
   * when it loses a worker): read them with ps_client_members. */
  int32_t dynamic_members;
  /* Dynamic loss scaling: the scale of iteration `version`'s loss; 0: none. */
  float loss_scale;
  int64_t num_segments; /* segments of the flat buffer */
  int64_t num_elements; /* floats in the flat buffer (the model's size) */
  /* What each version after 0 holds (the server's --optimizer): "sgd", the
   * parameters after the server's SGD step; "none", the iteration's mean
   * gradient, which the caller applies with an optimizer of its own (a
   * sum-only server, docs/training.md). */
  char optimizer[PS_OPTIMIZER_SIZE];
} ps_registration;

typedef struct ps_client ps_client; /* one worker's connection to the job */
typedef struct ps_handle ps_handle; /* one push or pull in flight, or done */

/* PS_CLIENT_ABI_VERSION as this library was built. Cannot fail. */
int32_t ps_client_abi_version(void);

/* "OK", "INVALID_ARGUMENT", ... ; "UNKNOWN_CODE" for a value outside the
 * list. A static string. Cannot fail. */
const char* ps_status_name(ps_status status);

/* Fills `options` with the defaults above. `abi_version` is the caller's
 * PS_CLIENT_ABI_VERSION: PS_FAILED_PRECONDITION, naming both, when this
 * library speaks another. */
ps_status ps_options_init(ps_options* options, int32_t abi_version, ps_error* error);

/* A client of the servers `options` names. Checks every option (the server
 * list, connections >= 1, non-negative timeouts, the compression, the TLS
 * files, the job token's file and length) and opens no connection yet:
 * register does. On PS_OK, *client is the caller's, to ps_client_close. */
ps_status ps_client_connect(const ps_options* options, ps_client** client, ps_error* error);

/* Waits for this client's pushes and pulls in flight to finish (the
 * server's deadlines bound the wait), then closes its connections. No other
 * call on `client` may run or follow; its handles stay valid (all done).
 * NULL: nothing. Cannot fail. */
void ps_client_close(ps_client* client);

/* Registers this worker's model with the job and fills *registration (may
 * be NULL). `tensors`: num_tensors >= 1 tensors, all PS_DTYPE_F32 (another
 * dtype is PS_INVALID_ARGUMENT naming the tensor). `initial`: the model's
 * initial values, initial_elements of them (the model's size; or NULL and
 * 0: none to give), sent only if the job asks this worker for them (rank 0
 * of a server without parameters): pull version registration->version to
 * get the values the job uses. `steps_per_epoch`: iterations in one epoch
 * of this worker's data, for the server's schedule (0: none; all workers
 * must agree). Blocks until a server answers (up to connect_timeout_ms:
 * then PS_UNAVAILABLE). A server that holds another model refuses,
 * naming the first difference. Exclusive; PS_FAILED_PRECONDITION once
 * registered (reconnect registers again). */
ps_status ps_client_register(ps_client* client, const ps_tensor_spec* tensors, int64_t num_tensors,
                             const float* initial, int64_t initial_elements,
                             int64_t steps_per_epoch, ps_registration* registration,
                             ps_error* error);

/* The last registration's settings. PS_FAILED_PRECONDITION before register. */
ps_status ps_client_registration(ps_client* client, ps_registration* registration, ps_error* error);

/* The segments' end offsets into the flat buffer, in elements, ascending
 * (a segment may be empty), the last being the model's size: segment s is
 * [ends[s - 1], ends[s]), segment 0 starts at 0. Writes *count (the number
 * of segments) and, when `ends` is not NULL, the ends into ends[0, count):
 * PS_INVALID_ARGUMENT when capacity < count. PS_FAILED_PRECONDITION before
 * register. The segments are the server's messages (a small tensor shares
 * one, a large one spans several), fixed until the next reconnect. */
ps_status ps_client_segment_ends(ps_client* client, int64_t* ends, int64_t capacity, int64_t* count,
                                 ps_error* error);

/* Starts pushing segments [first, last) of `gradient` for `iteration` and
 * returns at once with *handle, the caller's to ps_handle_free.
 * `gradient`: the whole flat buffer, `elements` long (the model's size);
 * only the segments pushed are read, until the handle is done. The values
 * are this worker's gradient summed over its `num_samples` samples of the
 * iteration (the same count in every push of one iteration); the server
 * averages over all workers' samples. The handle ends with PS_OK once the
 * server has accepted them, or the server's refusal: a non-finite value
 * (naming the tensor and element), a push for another iteration than the
 * server is at (naming both), a lost server (PS_UNAVAILABLE, PS_ABORTED:
 * reconnect). Returns PS_INVALID_ARGUMENT (no handle) for a bad range
 * (0 <= first <= last <= segments), buffer size or negative number. */
ps_status ps_client_push(ps_client* client, int64_t iteration, int64_t num_samples, int32_t first,
                         int32_t last, const float* gradient, int64_t elements, ps_handle** handle,
                         ps_error* error);

/* Starts pulling segments [first, last) of version `version` into `params`
 * (the whole flat buffer, `elements` long; only those segments are written,
 * until the handle is done) and returns at once with *handle. The server
 * holds the pull until those segments of that version exist (sync: every
 * worker's push of iteration version - 1 is applied), up to
 * wait_timeout_ms (then PS_DEADLINE_EXCEEDED); async brings the newest, and
 * ssp:S any version from version - S on. Refusals as ps_client_push's. */
ps_status ps_client_pull(ps_client* client, int64_t version, int32_t first, int32_t last,
                         float* params, int64_t elements, ps_handle** handle, ps_error* error);

/* Waits up to timeout_ms (negative: without limit; 0: not at all) for the
 * operation. Done: *done = 1 and the operation's status is returned (and
 * written to *error), every time it is asked. Not done in time: *done = 0
 * and PS_OK. Several threads may wait on one handle. */
ps_status ps_handle_wait(ps_handle* handle, int64_t timeout_ms, int32_t* done, ps_error* error);

/* ps_handle_wait with timeout 0. */
ps_status ps_handle_poll(ps_handle* handle, int32_t* done, ps_error* error);

/* Frees the handle. An operation in flight cannot be called back (its
 * buffer is the network's until it ends), so this first waits for it to
 * finish. No other call on `handle` may run or follow. NULL: nothing.
 * Cannot fail. */
void ps_handle_free(ps_handle* handle);

/* Blocks until version `version` is published (every worker's push of
 * iteration version - 1 applied), up to wait_timeout_ms. Exclusive. */
ps_status ps_client_wait_for_version(ps_client* client, int64_t version, ps_error* error);

/* Blocks while pulling the whole model of version `version` (or what the
 * consistency gives for it) into `params` (`elements` long) and writes the
 * version pulled to *pulled_version (may be NULL). After register or
 * reconnect: pull registration.version. Exclusive. */
ps_status ps_client_pull_all(ps_client* client, int64_t version, float* params, int64_t elements,
                             int64_t* pulled_version, ps_error* error);

/* The ranks taking part in iteration `iteration`, ascending: writes *count
 * and, when `ranks` is not NULL, ranks[0, count) (PS_INVALID_ARGUMENT when
 * capacity < count). A worker's part of the global batch is its index
 * among them. Blocks until this client knows them: from the registration
 * for its version, from the replies to the pushes of iteration - 1 for the
 * others (up to rpc_timeout_ms). May overlap pushes and pulls in flight. */
ps_status ps_client_members(ps_client* client, int64_t iteration, int32_t* ranks, int32_t capacity,
                            int32_t* count, ps_error* error);

/* Dynamic loss scaling: the scale to multiply the next step's loss by, as
 * the server sent it with the newest parameters pulled; 0 when the server
 * does not scale. Never waits. */
ps_status ps_client_loss_scale(ps_client* client, float* scale, ps_error* error);

/* Registers again, with the tensors register gave, after a call failed with
 * PS_UNAVAILABLE, PS_CANCELLED or PS_ABORTED (the server went away or
 * restarted): waits up to reconnect_timeout_ms for it, asking for the rank
 * held, and fills *registration (may be NULL). The worker resumes at its
 * version, which may be older than where it was (a server restarted from a
 * checkpoint): pull it. `initial` as register's. PS_UNIMPLEMENTED over
 * several shards. Exclusive. */
ps_status ps_client_reconnect(ps_client* client, const float* initial, int64_t initial_elements,
                              ps_registration* registration, ps_error* error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PS_WORKER_CLIENT_PS_CLIENT_H_ */
