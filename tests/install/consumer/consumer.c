/* Links against an installed lnmlp and checks that the library it loads is the one it was built for. */
#include <stdio.h>

#include <lnmlp.h>

int main(void) {
  int32_t major = -1, abi = -1;
  lnmlp_desc* d = NULL;
  lnmlp_plan* p = NULL;
  if (lnmlp_get_version(&major, NULL, NULL, &abi) != LNMLP_SUCCESS || abi != LNMLP_ABI_VERSION) return 1;
  if (lnmlp_desc_create(&d) != LNMLP_SUCCESS || lnmlp_desc_set_shape(d, 4, 8, 16) != LNMLP_SUCCESS) return 2;
  if (lnmlp_plan_create(d, &p) != LNMLP_SUCCESS) {
    fprintf(stderr, "%s\n", lnmlp_last_error());
    return 3;
  }
  lnmlp_plan_destroy(p);
  lnmlp_desc_destroy(d);
  printf("consumer: lnmlp %d, ABI %d\n", major, abi);
  return 0;
}
