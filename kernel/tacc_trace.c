// SPDX-License-Identifier: GPL-2.0-only
/* tacc tracepoint definitions (system "tacc"). */
#define CREATE_TRACE_POINTS
#include "tacc_trace.h"
