// SPDX-License-Identifier: MIT
// <infiniband/softverbs_dv.h> compiles alone, as C++ (see meson.build).
#include <infiniband/softverbs_dv.h>

int main()
{
	softverbs_fast_reg_wr w{};
	return static_cast<int>(softverbs_key_with(w.key, 0)) + (SOFTVERBS_FD_MEMFD == 2 ? 0 : 1);
}
