/* ps_client.h as a C99 caller sees it, against libps_client.so itself:
 * the header compiles as strict C99 and the shared library's exported
 * symbols link and answer. No server: the calls that need one are
 * ps_client_test.cc's. */

#include <stdio.h>
#include <string.h>

#include "worker/client/ps_client.h"

static int failures = 0;

#define EXPECT(condition)                                                      \
  do {                                                                         \
    if (!(condition)) {                                                        \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

int main(void) {
  ps_options options;
  ps_error error;
  ps_client* client = NULL;
  ps_tensor_spec tensor;
  int64_t shape[2] = {2, 3};
  ps_status status;

  EXPECT(ps_client_abi_version() == PS_CLIENT_ABI_VERSION);
  EXPECT(strcmp(ps_status_name(PS_UNAVAILABLE), "UNAVAILABLE") == 0);

  EXPECT(ps_options_init(&options, PS_CLIENT_ABI_VERSION, &error) == PS_OK);
  EXPECT(error.code == PS_OK && error.message[0] == '\0');
  EXPECT(options.rank == -1 && options.connections == 1);
  EXPECT(strcmp(options.compression, "none") == 0);
  EXPECT(options.connect_timeout_ms == 60000);

  EXPECT(ps_client_connect(&options, &client, &error) == PS_INVALID_ARGUMENT);
  EXPECT(strstr(error.message, "servers is empty") != NULL);
  EXPECT(client == NULL);

  options.servers = "127.0.0.1:1"; /* nothing listens there */
  options.connect_timeout_ms = 200;
  options.log = NULL;
  EXPECT(ps_client_connect(&options, &client, &error) == PS_OK);
  tensor.name = "w";
  tensor.shape = shape;
  tensor.ndim = 2;
  tensor.dtype = PS_DTYPE_F32;
  status = ps_client_register(client, &tensor, 1, NULL, 0, 0, NULL, &error);
  EXPECT(status == PS_UNAVAILABLE);
  EXPECT(error.code == status);
  ps_client_close(client);

  if (failures > 0) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("ps_client C99 caller: all passed\n");
  return 0;
}
