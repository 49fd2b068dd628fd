#include "trace/trace-hw_tacc.h"
