/* Softmax of one vector in place; semantics of special values in softmax.h. */
#include "softmax.h"

KEXPORT("softmax_f32")
void softmax_f32(float *x, int n) { softmax_inplace(x, n); }
