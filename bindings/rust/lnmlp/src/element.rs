//! Element types of host tensors: `f32`, [`Bf16`] and [`F16`], and the sealed [`Element`] trait.

use std::fmt;

use crate::DType;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::Bf16 {}
    impl Sealed for super::F16 {}
}

/// An element type a plan's tensors can have; maps to the plan's [`DType`]. Sealed: implemented
/// for `f32`, [`Bf16`] and [`F16`] only.
pub trait Element: Copy + Default + PartialEq + fmt::Debug + Send + Sync + 'static + sealed::Sealed {
    /// The plan dtype whose tensors have this element type.
    const DTYPE: DType;
    /// Converts from `f32`, rounding to nearest, ties to even.
    fn from_f32(v: f32) -> Self;
    /// Converts to `f32` (exact).
    fn to_f32(self) -> f32;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

/// A 16-bit element type, `$t`, stored as its bit pattern, with what the two share around their
/// own `from_f32` and `to_f32`: the bit pattern's accessors, `From` both ways, `Debug`, `Display`
/// and [`Element`].
macro_rules! half_type {
    ($(#[$doc:meta])* $t:ident, $dtype:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        pub struct $t(pub u16);

        impl $t {
            /// The bit pattern.
            pub fn to_bits(self) -> u16 {
                self.0
            }

            /// The value of a bit pattern.
            pub fn from_bits(bits: u16) -> $t {
                $t(bits)
            }
        }

        impl From<f32> for $t {
            fn from(v: f32) -> $t {
                $t::from_f32(v)
            }
        }

        impl From<$t> for f32 {
            fn from(v: $t) -> f32 {
                v.to_f32()
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($t), "({})"), self.to_f32())
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }

        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn from_f32(v: f32) -> Self {
                $t::from_f32(v)
            }
            fn to_f32(self) -> f32 {
                $t::to_f32(self)
            }
        }
    };
}

half_type!(
    /// A bfloat16 value, stored as its bit pattern (the top 16 bits of an `f32`), as the library
    /// takes it (`LNMLP_DTYPE_BF16`).
    Bf16,
    DType::Bf16
);

impl Bf16 {
    /// Rounds an `f32` to the nearest bfloat16, ties to even; NaN stays a (quiet) NaN of the same
    /// sign, infinities stay infinities, overflow rounds to infinity.
    pub fn from_f32(v: f32) -> Bf16 {
        let bits = v.to_bits();
        if v.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x0040);
        }
        let lsb = (bits >> 16) & 1;
        let rounded = bits.wrapping_add(0x7fff + lsb);
        Bf16((rounded >> 16) as u16)
    }

    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

half_type!(
    /// An IEEE binary16 (half precision) value, stored as its bit pattern, as the library takes it
    /// (`LNMLP_DTYPE_F16`).
    F16,
    DType::F16
);

impl F16 {
    /// Rounds an `f32` to the nearest binary16, ties to even, with subnormals; magnitudes that
    /// round beyond 65504 become infinity; NaN stays a (quiet) NaN of the same sign.
    pub fn from_f32(v: f32) -> F16 {
        let bits = v.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let exp = ((bits >> 23) & 0xff) as i32;
        let man = bits & 0x007f_ffff;
        if exp == 0xff {
            // Inf or NaN
            let payload = if man != 0 { 0x0200 | (man >> 13) as u16 } else { 0 };
            return F16(sign | 0x7c00 | payload);
        }
        let e = exp - 127 + 15; // the biased half exponent
        if e >= 0x1f {
            return F16(sign | 0x7c00); // overflow
        }
        if e <= 0 {
            // A subnormal half (or zero): value = m * 2^-24.
            if e < -10 {
                return F16(sign); // below half the smallest subnormal: rounds to zero
            }
            let m = man | 0x0080_0000; // implicit bit
            let shift = (14 - e) as u32; // 24-bit significand -> 10-bit subnormal mantissa
            let half = 1u32 << (shift - 1);
            let mut r = m >> shift;
            let rest = m & ((1u32 << shift) - 1);
            if rest > half || (rest == half && (r & 1) == 1) {
                r += 1; // may carry into the smallest normal: the encoding handles it
            }
            return F16(sign | r as u16);
        }
        let mut h = ((e as u32) << 10) | (man >> 13);
        let rest = man & 0x1fff;
        if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
            h += 1; // a carry into the exponent is right, up to infinity
        }
        F16(sign | h as u16)
    }

    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let man = h & 0x03ff;
        let bits = if exp == 0x1f {
            sign | 0x7f80_0000 | (man << 13)
        } else if exp == 0 {
            if man == 0 {
                sign
            } else {
                // subnormal: man * 2^-24, exact in f32
                let v = man as f32 * f32::from_bits(0x3380_0000); // 2^-24
                return if sign != 0 { -v } else { v };
            }
        } else {
            sign | ((exp + 127 - 15) << 23) | (man << 13)
        };
        f32::from_bits(bits)
    }
}

/// Converts a slice of `f32` to any element type (rounding to nearest even).
pub fn convert_from_f32<T: Element>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// Converts a slice of any element type to `f32` (exact).
pub fn convert_to_f32<T: Element>(v: &[T]) -> Vec<f32> {
    v.iter().map(|&x| x.to_f32()).collect()
}
