// The human-readable build description behind lnmlp_get_build_info.
#pragma once

namespace lnmlp {
const char* build_info();
}
