/* c_step SERVER: one SGD step on the depot-server at SERVER ("host:port")
 * through the C API alone, as a C program built with
 *   cc c_step.c $(pkg-config --cflags --libs depot-client)
 * Exit status 0 when the updated weights are exactly w - lr * g and the
 * padding is zero. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "depot/depot.h"

static int Check(int code, const char* call) {
  if (code != DEPOT_OK) {
    fprintf(stderr, "c_step: %s: %s: %s\n", call, depot_status_name(code),
            depot_last_error());
  }
  return code == DEPOT_OK;
}

int main(int argc, char** argv) {
  const char* servers[1];
  depot_tensor_spec_t tensors[2] = {{"w", 300, 0}, {"b", 7, 1}};
  depot_job_config_t config;
  depot_client_t* client = NULL;
  depot_job_t* job = NULL;
  depot_step_result_t result;
  float *weights, *grads, *updated;
  char* is_tensor;
  uint64_t n, i, checked = 0;
  size_t t;
  int ok = 1;

  if (argc != 2) {
    fprintf(stderr, "usage: c_step HOST:PORT\n");
    return 2;
  }
  if (depot_api_version() != DEPOT_API_VERSION) {
    fprintf(stderr, "c_step: library API %u, header %d\n",
            (unsigned)depot_api_version(), DEPOT_API_VERSION);
    return 1;
  }
  servers[0] = argv[1];
  if (!Check(depot_client_create(servers, 1, NULL, &client),
             "depot_client_create") ||
      !Check(depot_client_wait_for_servers(client, 60.0),
             "depot_client_wait_for_servers")) {
    return 1;
  }
  depot_job_config_init(&config);
  config.name = "c-step";
  config.tensors = tensors;
  config.num_tensors = 2;
  config.chunk_elems = 128;
  config.optimizer.kind = DEPOT_OPTIMIZER_SGD;
  config.optimizer.lr = 0.5;
  config.optimizer.sgd_momentum = 0.0;
  config.optimizer.weight_decay = 0.0;
  if (!Check(depot_job_open(client, &config, 0, &job), "depot_job_open")) {
    return 1;
  }

  n = depot_job_total_elems(job);
  weights = calloc(n, sizeof(float));
  grads = calloc(n, sizeof(float));
  updated = calloc(n, sizeof(float));
  is_tensor = calloc(n, 1);
  if (!weights || !grads || !updated || !is_tensor) return 1;
  /* Dyadic values: w - 0.5 * g is exact in fp32, so the check is bitwise. */
  for (t = 0; t < depot_job_num_tensors(job); ++t) {
    uint64_t offset = depot_job_tensor_offset(job, t);
    for (i = 0; i < tensors[t].numel; ++i) {
      weights[offset + i] = (float)(i % 16) * 0.25f;
      grads[offset + i] = (float)(i % 3) - 1.0f;
      updated[offset + i] = -1.0f;
      is_tensor[offset + i] = 1;
    }
  }
  ok = Check(depot_job_init_weights(job, weights, DEPOT_DTYPE_FP32),
             "depot_job_init_weights") &&
       Check(depot_job_step(job, 1, grads, updated, NULL, &result),
             "depot_job_step");
  if (ok && (result.step != 1 || result.skipped)) {
    fprintf(stderr, "c_step: unexpected result: step %llu, skipped %d\n",
            (unsigned long long)result.step, (int)result.skipped);
    ok = 0;
  }
  for (i = 0; ok && i < n; ++i) {
    float expected = is_tensor[i] ? weights[i] - 0.5f * grads[i] : 0.0f;
    if (updated[i] != expected) {
      fprintf(stderr, "c_step: weight %llu is %.9g, expected %.9g\n",
              (unsigned long long)i, updated[i], expected);
      ok = 0;
    }
    checked += is_tensor[i];
  }
  ok = ok && Check(depot_job_delete(job), "depot_job_delete");
  if (ok) printf("c_step: step 1 updated %llu weights as expected\n",
                 (unsigned long long)checked);

  depot_job_destroy(job);
  depot_client_destroy(client);
  free(weights);
  free(grads);
  free(updated);
  free(is_tensor);
  return ok ? 0 : 1;
}
