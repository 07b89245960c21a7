// Element types of the GDN kernels and their scalar conversions (round to nearest even).
//
// Everything here has internal linkage (anonymous namespace) on purpose: each ISA translation
// unit is compiled with its own -m flags, and a shared inline symbol could otherwise be emitted
// with AVX-512 instructions in one unit and picked by the linker for the portable one.
#pragma once

#include <cstdint>
#include <cstring>

namespace gdn {

// Element type of a tensor as seen by the kernels (bf16 and fp16 are raw 16-bit patterns).
enum class DType : int { F32 = 0, BF16 = 1, F16 = 2 };

namespace {

inline const char* dtype_name(DType d) {
    return d == DType::F32 ? "float32" : d == DType::BF16 ? "bfloat16" : "float16";
}

inline int dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }

// fp32 -> bf16, round to nearest even; NaN stays a quiet NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// Branch-free (the compiler can vectorize loops over it): rebias exponent and mantissa, then fix
// up inf/NaN (exponent 31) and zero/subnormals (exponent 0: mant * 2^-24, exact in fp32).
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t em = uint32_t(h & 0x7fffu) << 13;  // exponent and mantissa in fp32 position
    const uint32_t exp = em & 0x0f800000u;
    const uint32_t normal = em + (112u << 23);
    const uint32_t special = em + (224u << 23);  // exponent 31 -> 255: inf, NaN keeps its payload
    const uint32_t sub = f32_bits(bits_f32(em + (113u << 23)) - bits_f32(113u << 23));
    const uint32_t mag = exp == 0x0f800000u ? special : exp == 0 ? sub : normal;
    return bits_f32(mag | sign);
}

// fp32 -> fp16, round to nearest even; overflow gives inf, NaN a quiet NaN. Branch-free: all
// three cases are computed and one is selected.
inline uint16_t f32_to_f16(float value) {
    const uint32_t x = f32_bits(value);
    const uint32_t sign = x & 0x80000000u;
    const uint32_t f = x ^ sign;
    // |x| >= 65536 (or inf / NaN)
    const uint32_t big = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
    // |x| < 2^-14: fp16 subnormal or zero; adding 0.5f rounds at the 2^-24 grid (RNE)
    const uint32_t small = f32_bits(bits_f32(f) + bits_f32(126u << 23)) - (126u << 23);
    // normal: rebias and round the 13 dropped bits (a carry into the exponent rounds up to inf)
    const uint32_t normal = (f + (uint32_t(15 - 127) << 23) + 0xfffu + ((f >> 13) & 1u)) >> 13;
    const uint32_t out = f >= (143u << 23) ? big : f < (113u << 23) ? small : normal;
    return uint16_t(out | (sign >> 16));
}

// Read element i of a buffer of type dt as fp32.
inline float load_scalar(const void* p, DType dt, int64_t i) {
    switch (dt) {
        case DType::F32: return static_cast<const float*>(p)[i];
        case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
        default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    }
}

// Write fp32 x (rounded to nearest even) as element i of a buffer of type dt.
inline void store_scalar(void* p, DType dt, int64_t i, float x) {
    switch (dt) {
        case DType::F32: static_cast<float*>(p)[i] = x; break;
        case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(x); break;
        default: static_cast<uint16_t*>(p)[i] = f32_to_f16(x); break;
    }
}

// x rounded to nearest even to dt and back to fp32 (dt F32: x).
inline float round_to(float x, DType dt) {
    if (dt == DType::BF16) return bf16_to_f32(f32_to_bf16(x));
    if (dt == DType::F16) return f16_to_f32(f32_to_f16(x));
    return x;
}

}  // namespace
}  // namespace gdn
