/* SPDX-License-Identifier: MIT */
/* <infiniband/softverbs_dv.h> compiles alone, as C (see meson.build). */
#include <infiniband/softverbs_dv.h>

int main(void)
{
	struct softverbs_fast_reg_wr w = {0};
	return (int)softverbs_key_with(w.key, 0) + (SOFTVERBS_FD_MEMFD == 2 ? 0 : 1);
}
