// AVX-512 build of the GDN kernels (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16).
#include "gdn_isa_avx512.hpp"

GDN_DEFINE_ISA(avx512, Avx512Isa)
