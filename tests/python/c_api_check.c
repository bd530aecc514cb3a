/* depot_c_api_check: depot.h is plain C. Compiled as C99, this program
 * includes the header and checks the error contract of calls that need no
 * server (the pytest tests in this folder cover the rest through ctypes).
 * Exit status 0 when every check holds. */
#include <stdio.h>
#include <string.h>

#include "depot/depot.h"

static int failures = 0;

#define EXPECT(condition)                                                    \
  do {                                                                       \
    if (!(condition)) {                                                      \
      fprintf(stderr, "%s:%d: expected %s (last error: \"%s\")\n", __FILE__, \
              __LINE__, #condition, depot_last_error());                     \
      ++failures;                                                            \
    }                                                                        \
  } while (0)

static int LastErrorContains(const char* text) {
  return strstr(depot_last_error(), text) != NULL;
}

int main(void) {
  const char* servers[] = {"127.0.0.1:1"};
  depot_client_t* client = NULL;
  depot_client_options_t options;
  depot_job_config_t config;
  depot_tensor_spec_t tensors[] = {{"w", 10, 0}};
  depot_job_t* job = NULL;

  EXPECT(depot_api_version() == DEPOT_API_VERSION);

  EXPECT(depot_client_create(NULL, 0, NULL, &client) == DEPOT_INVALID_ARGUMENT);
  EXPECT(client == NULL);
  EXPECT(LastErrorContains("servers is empty"));

  depot_client_options_init(&options);
  options.max_inflight_chunks = 0;
  EXPECT(depot_client_create(servers, 1, &options, &client) ==
         DEPOT_INVALID_ARGUMENT);
  EXPECT(LastErrorContains("max_inflight_chunks"));

  /* Connecting does not wait for the server: no server is needed. */
  depot_client_options_init(&options);
  EXPECT(depot_client_create(servers, 1, &options, &client) == DEPOT_OK);
  EXPECT(strcmp(depot_last_error(), "") == 0);

  depot_job_config_init(&config);
  EXPECT(depot_job_open(client, &config, 0, &job) == DEPOT_INVALID_ARGUMENT);
  EXPECT(LastErrorContains("config->name is NULL"));

  /* The config is validated before any RPC. */
  config.name = "c-api-check";
  config.tensors = tensors;
  config.num_tensors = 1;
  config.num_workers = 0;
  EXPECT(depot_job_open(client, &config, 0, &job) == DEPOT_INVALID_ARGUMENT);
  EXPECT(LastErrorContains("num_workers"));
  EXPECT(job == NULL);

  EXPECT(strcmp(depot_status_name(DEPOT_FAILED_PRECONDITION),
                "FAILED_PRECONDITION") == 0);

  depot_grad_scaler_t* scaler = NULL;
  EXPECT(depot_grad_scaler_create(NULL, &scaler) == DEPOT_INVALID_ARGUMENT);
  EXPECT(LastErrorContains("job"));
  EXPECT(scaler == NULL);
  EXPECT(depot_grad_scaler_scale(NULL) == 0.0);
  depot_grad_scaler_update(NULL, 1);
  depot_grad_scaler_state_t scaler_state;
  EXPECT(depot_grad_scaler_get_state(NULL, &scaler_state) ==
         DEPOT_INVALID_ARGUMENT);
  EXPECT(depot_grad_scaler_load_state(NULL, &scaler_state) ==
         DEPOT_INVALID_ARGUMENT);
  EXPECT(LastErrorContains("scaler"));
  depot_grad_scaler_destroy(NULL);

  void* state = NULL;
  size_t state_size = 0;
  EXPECT(depot_job_save_state(NULL, &state, &state_size) ==
         DEPOT_INVALID_ARGUMENT);
  EXPECT(LastErrorContains("job"));
  EXPECT(state == NULL);
  EXPECT(depot_job_load_state(NULL, NULL, 0) == DEPOT_INVALID_ARGUMENT);
  depot_buffer_free(NULL);

  depot_job_destroy(NULL);
  depot_client_destroy(NULL);
  depot_client_destroy(client);
  if (failures > 0) return 1;
  printf("depot.h: all C API checks passed\n");
  return 0;
}
