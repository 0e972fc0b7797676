//! The element types a collective can reduce: `f32`, `f64`, `half::bf16` and `half::f16`.
//!
//! The trait is sealed so that the byte views below stay sound: every implementor is
//! plain old data with no padding, and every bit pattern is a valid value. It does
//! not do integer types, and it never reorders additions: `add_assign_bytes` adds
//! element by element, so the order of additions is the caller's.
//!
//! Invariant: all ranks of a ring share the byte order (native order is sent raw).

use std::fmt::Debug;

use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// Which element type a frame carries, so that ranks that disagree find out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Dtype {
    /// IEEE 754 binary32.
    F32 = 1,
    /// IEEE 754 binary64.
    F64 = 2,
    /// bfloat16.
    Bf16 = 3,
    /// IEEE 754 binary16.
    F16 = 4,
}

/// A floating-point type a collective can reduce.
///
/// Sealed: the collectives send the values' bytes as they are in memory, which is
/// only sound for the four types implemented here.
pub trait Element:
    sealed::Sealed + Copy + Default + PartialEq + Debug + Send + Sync + 'static
{
    /// The type's tag on the wire, checked by the receiver.
    const DTYPE: Dtype;
    /// Bytes per value.
    const SIZE: usize;

    /// Adds the values encoded in `src` (native byte order) to `dst`, element by
    /// element: `dst[i] = dst[i] + src[i]`.
    ///
    /// `src.len()` must be `dst.len() * SIZE`.
    fn add_assign_bytes(dst: &mut [Self], src: &[u8]);

    /// Adds `src` to `dst` element by element, the local step of the small-buffer path.
    fn add_assign(dst: &mut [Self], src: &[Self]);

    /// Divides every value by `divisor`, the last step of [`super::ReduceOp::Mean`].
    fn divide(values: &mut [Self], divisor: u32);

    /// The values' bytes, sent as they are.
    fn as_bytes(values: &[Self]) -> &[u8];

    /// The values' bytes, written in place by a receive.
    fn as_bytes_mut(values: &mut [Self]) -> &mut [u8];

    /// Converts from `f64` (rounding), for tests and benches.
    fn from_f64(value: f64) -> Self;

    /// Converts to `f64`, for tests and benches.
    fn to_f64(self) -> f64;
}

macro_rules! byte_views {
    () => {
        fn as_bytes(values: &[Self]) -> &[u8] {
            // SAFETY: `Self` is plain old data without padding (sealed to the four
            // float types), so its bytes may be read as `u8`; the length is the exact
            // byte size of the slice and the lifetime is the input's.
            unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values)) }
        }

        fn as_bytes_mut(values: &mut [Self]) -> &mut [u8] {
            // SAFETY: as above, and every bit pattern is a valid value of `Self`, so
            // any bytes written through the view leave valid values.
            unsafe {
                std::slice::from_raw_parts_mut(
                    values.as_mut_ptr().cast::<u8>(),
                    size_of_val(values),
                )
            }
        }
    };
}

macro_rules! native_float {
    ($ty:ty, $dtype:expr) => {
        impl Element for $ty {
            const DTYPE: Dtype = $dtype;
            const SIZE: usize = size_of::<$ty>();

            fn add_assign_bytes(dst: &mut [Self], src: &[u8]) {
                assert_eq!(
                    src.len(),
                    dst.len() * Self::SIZE,
                    "source and destination differ in length"
                );
                for (value, bytes) in dst.iter_mut().zip(src.chunks_exact(Self::SIZE)) {
                    let bytes = bytes.try_into().expect("chunks_exact yields SIZE bytes");
                    *value += <$ty>::from_ne_bytes(bytes);
                }
            }

            fn add_assign(dst: &mut [Self], src: &[Self]) {
                assert_eq!(
                    src.len(),
                    dst.len(),
                    "source and destination differ in length"
                );
                for (value, other) in dst.iter_mut().zip(src) {
                    *value += *other;
                }
            }

            fn divide(values: &mut [Self], divisor: u32) {
                let divisor = divisor as $ty;
                for value in values {
                    *value /= divisor;
                }
            }

            byte_views!();

            fn from_f64(value: f64) -> Self {
                value as $ty
            }

            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}

native_float!(f32, Dtype::F32);
native_float!(f64, Dtype::F64);

// The half types add in f32 and round once, as `half`'s operators do; both orders
// of one addition give the same bits, so only the order across ranks matters.
macro_rules! half_float {
    ($ty:ty, $dtype:expr) => {
        impl Element for $ty {
            const DTYPE: Dtype = $dtype;
            const SIZE: usize = 2;

            fn add_assign_bytes(dst: &mut [Self], src: &[u8]) {
                assert_eq!(
                    src.len(),
                    dst.len() * Self::SIZE,
                    "source and destination differ in length"
                );
                for (value, bytes) in dst.iter_mut().zip(src.chunks_exact(Self::SIZE)) {
                    let other = <$ty>::from_ne_bytes([bytes[0], bytes[1]]);
                    *value = <$ty>::from_f32(value.to_f32() + other.to_f32());
                }
            }

            fn add_assign(dst: &mut [Self], src: &[Self]) {
                assert_eq!(
                    src.len(),
                    dst.len(),
                    "source and destination differ in length"
                );
                for (value, other) in dst.iter_mut().zip(src) {
                    *value = <$ty>::from_f32(value.to_f32() + other.to_f32());
                }
            }

            fn divide(values: &mut [Self], divisor: u32) {
                let divisor = divisor as f32;
                for value in values {
                    *value = <$ty>::from_f32(value.to_f32() / divisor);
                }
            }

            byte_views!();

            fn from_f64(value: f64) -> Self {
                <$ty>::from_f64(value)
            }

            fn to_f64(self) -> f64 {
                <$ty>::to_f64(self)
            }
        }
    };
}

half_float!(bf16, Dtype::Bf16);
half_float!(f16, Dtype::F16);

#[cfg(test)]
mod tests {
    use super::*;

    fn check_add<T: Element>(a: &[f64], b: &[f64], expected: &[f64]) {
        let mut dst: Vec<T> = a.iter().map(|&x| T::from_f64(x)).collect();
        let src: Vec<T> = b.iter().map(|&x| T::from_f64(x)).collect();
        T::add_assign_bytes(&mut dst, T::as_bytes(&src));
        let got: Vec<f64> = dst.iter().map(|x| x.to_f64()).collect();
        assert_eq!(got, expected);
        let mut dst2: Vec<T> = a.iter().map(|&x| T::from_f64(x)).collect();
        T::add_assign(&mut dst2, &src);
        assert_eq!(dst, dst2);
    }

    #[test]
    fn every_type_adds_from_bytes() {
        check_add::<f32>(&[1.0, 2.5], &[3.0, -0.5], &[4.0, 2.0]);
        check_add::<f64>(&[1.0, 2.5], &[3.0, -0.5], &[4.0, 2.0]);
        check_add::<bf16>(&[1.0, 2.5], &[3.0, -0.5], &[4.0, 2.0]);
        check_add::<f16>(&[1.0, 2.5], &[3.0, -0.5], &[4.0, 2.0]);
    }

    #[test]
    fn byte_views_round_trip() {
        let mut values = [f16::from_f32(1.5), f16::from_f32(-2.0)];
        let bytes = f16::as_bytes(&values).to_vec();
        assert_eq!(bytes.len(), 4);
        f16::as_bytes_mut(&mut values).fill(0);
        assert_eq!(values, [f16::ZERO, f16::ZERO]);
        f16::as_bytes_mut(&mut values).copy_from_slice(&bytes);
        assert_eq!(values[0].to_f32(), 1.5);
    }

    #[test]
    fn divide_is_the_same_operation_for_every_caller() {
        let mut values = [bf16::from_f32(3.0), bf16::from_f32(1.0)];
        bf16::divide(&mut values, 3);
        assert_eq!(values[0].to_f32(), 1.0);
        let mut floats = [3.0f32, 1.0];
        f32::divide(&mut floats, 2);
        assert_eq!(floats, [1.5, 0.5]);
    }
}
