/* The C ABI from C (C99, -Wall -Wextra -Werror -pedantic): load, signature, run at the smallest value of
 * each dynamic dim with runtime-allocated outputs, print each output's shape and sum.
 *
 *   c_consumer MODEL.bpk   (float32 inputs 0.25, integer inputs 1)
 */
#include <bladepack/runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  bpk_model* model = NULL;
  const bpk_signature* sig = NULL;
  bpk_tensor* in = NULL;
  bpk_tensor* out = NULL;
  int64_t i, k, e;
  int rc = 1;
  bpk_status status;
  if (argc != 2) {
    fprintf(stderr, "usage: c_consumer MODEL.bpk\n");
    return 2;
  }
  if (bpk_model_load(argv[1], NULL, &model) != BPK_OK || bpk_model_signature(model, &sig) != BPK_OK) {
    fprintf(stderr, "c_consumer: %s\n", bpk_last_error());
    goto done;
  }
  printf("%s\n", sig->text);
  in = (bpk_tensor*)calloc((size_t)sig->num_inputs + 1, sizeof *in);
  out = (bpk_tensor*)calloc((size_t)sig->num_outputs + 1, sizeof *out);
  for (i = 0; i < sig->num_inputs; ++i) {
    const bpk_tensor_spec* s = &sig->inputs[i];
    int64_t count = 1;
    in[i].dtype = s->dtype;
    in[i].ndim = s->ndim;
    for (k = 0; k < s->ndim; ++k) {
      int64_t d = s->dims[k];
      if (d < 0) { /* dynamic: the smallest value its symbol allows, when the dim is the symbol itself */
        int64_t j;
        d = 1;
        for (j = 0; j < sig->num_symbols; ++j)
          if (strcmp(sig->symbols[j].name, s->dim_exprs[k]) == 0) d = sig->symbols[j].min;
      }
      in[i].shape[k] = d;
      count *= d;
    }
    in[i].data = calloc((size_t)count + 1, bpk_dtype_size(s->dtype));
    for (e = 0; e < count; ++e) {
      if (s->dtype == BPK_FLOAT32) ((float*)in[i].data)[e] = 0.25f;
      if (s->dtype == BPK_INT64) ((int64_t*)in[i].data)[e] = 1;
    }
  }
  status = bpk_model_run(model, in, sig->num_inputs, out, sig->num_outputs);
  if (status != BPK_OK) {
    fprintf(stderr, "c_consumer: %s: %s\n", bpk_status_name(status), bpk_last_error());
    goto done;
  }
  for (k = 0; k < sig->num_outputs; ++k) {
    double sum = 0;
    int64_t n = 1;
    for (i = 0; i < out[k].ndim; ++i) n *= out[k].shape[i];
    if (out[k].dtype == BPK_FLOAT32)
      for (e = 0; e < n; ++e) sum += ((const float*)out[k].data)[e];
    printf("%s: %s, %lld elements, sum %.9g\n", sig->outputs[k].name, bpk_dtype_name(out[k].dtype), (long long)n, sum);
  }
  rc = 0;
done:
  if (in)
    for (i = 0; sig && i < sig->num_inputs; ++i) free(in[i].data);
  if (out)
    for (k = 0; sig && k < sig->num_outputs; ++k) bpk_free(out[k].data);
  free(in);
  free(out);
  bpk_model_free(model);
  return rc;
}
