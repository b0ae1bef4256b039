// Q1.15 / Q1.31 fixed-point conversions (mlx_precise/fixedpoint/qformat.py, docs/fixedpoint.md).
//
// A Q1.b code q (b = 15: int16, b = 31: int32) represents q / 2^b. Conversion from a
// float x, the "SF16" semantics (docs/fixedpoint.md; CMSIS-DSP arm_float_to_q15):
//   1. clamp x to [-t, t] (t: the threshold, a float32 in (0, 1]);
//   2. y = x * 2^b: exact, a power-of-two scaling of |x| <= 1 (no overflow; a float32
//      subnormal x is read as zero on Apple GPUs and rounds to code 0 anyway);
//   3. round y to an integer (FX_HALF_EVEN: IEEE roundTiesToEven, the reference;
//      FX_HALF_AWAY and FX_TRUNCATE: the CMSIS-DSP conventions);
//   4. saturate to [-2^b, 2^b - 1] (only y = 2^b, i.e. t = 1 and x >= 1, needs it).
// NaN has no code: it converts to 0 (as AArch64's saturating FCVT* instructions do,
// and sign-neutral, unlike a clamp that happens to send NaN to +t). The fused
// simulation instead propagates NaN (see fx_simulate).
// rint, round and trunc are exact operations in MSL (0 ulp); only float32
// comparisons, one power-of-two product and int <-> float conversions are used, so
// the result does not depend on fast-math or contraction settings.
#pragma once

// Rounding modes: values shared with mlx_precise/fixedpoint/qformat.py (_ROUNDING).
#define FX_HALF_EVEN 0u
#define FX_HALF_AWAY 1u
#define FX_TRUNCATE 2u

// Steps 1-3: the rounded scaled value as an integral float in [-2^b, 2^b].
METAL_FUNC float fx_round_scaled(float x, float t, uint rounding, uint bits) {
  float y = metal::clamp(x, -t, t) * (bits == 15u ? 32768.0f : 2147483648.0f);
  if (rounding == FX_HALF_EVEN) {
    return metal::rint(y);
  }
  if (rounding == FX_TRUNCATE) {
    return metal::trunc(y);
  }
  // Ties away from zero, spelled out rather than metal::round so that it visibly
  // cannot be the floor(y + 0.5) shortcut (wrong at 0.5 - 2^-25): y - trunc(y) is
  // exact (the fraction of a float is a float), so the test below is exact too.
  float r = metal::trunc(y);
  return metal::abs(y - r) >= 0.5f ? r + metal::copysign(1.0f, y) : r;
}

// Steps 1-4: the Q1.b code; NaN -> 0.
METAL_FUNC int fx_code(float x, float t, uint rounding, uint bits) {
  if (metal::isnan(x)) {
    return 0;
  }
  float q = fx_round_scaled(x, t, rounding, bits);
  // q >= -2^b always (t <= 1); q = 2^b is the one value outside the code range.
  if (bits == 15u) {
    return q >= 32768.0f ? 32767 : int(q);
  }
  return q >= 2147483648.0f ? 2147483647 : int(q);
}

// The value of a code: q / 2^b, i.e. RN32(q) * 2^-b (int -> float rounds to nearest
// even; exact for Q1.15 and for |q| < 2^24; the scaling is exact).
METAL_FUNC float fx_value(int q, uint bits) {
  return float(q) * (bits == 15u ? 0x1p-15f : 0x1p-31f);
}

// The round trip fx_value(fx_code(x)) as one float32, except that NaN stays NaN so
// that a diverging simulation is visible instead of continuing from a plausible 0.
METAL_FUNC float fx_simulate(float x, float t, uint rounding, uint bits) {
  return metal::isnan(x) ? x : fx_value(fx_code(x, t, rounding, bits), bits);
}
