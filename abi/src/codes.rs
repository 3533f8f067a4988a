//! Enums whose values are numeric codes of the segments' ABI. One macro
//! gives each the same three things, so a code read from shared memory is
//! turned into its enum one way everywhere: `ALL`, `code()`, and
//! `from_code()` (`None` for a code this build does not know).

/// Defines a `#[repr(u32)]` enum of ABI codes with `ALL`, `code` and
/// `from_code`. Every variant needs an explicit value: the numbers are
/// the ABI, not the order of declaration.
macro_rules! abi_codes {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$( $name::$variant, )+];

            /// The code stored in the segment.
            pub const fn code(self) -> u32 {
                self as u32
            }

            /// The value of a code read from a segment, if this build knows it.
            pub fn from_code(code: u32) -> Option<$name> {
                Self::ALL.iter().copied().find(|v| v.code() == code)
            }
        }
    };
}

pub(crate) use abi_codes;

#[cfg(test)]
mod tests {
    abi_codes! {
        /// Codes out of declaration order, as an ABI may have them.
        pub enum Sparse {
            B = 7,
            A = 2,
        }
    }

    #[test]
    fn codes_are_the_declared_values_and_unknown_ones_are_refused() {
        assert_eq!(Sparse::ALL, &[Sparse::B, Sparse::A]);
        assert_eq!(Sparse::B.code(), 7);
        assert_eq!(Sparse::from_code(2), Some(Sparse::A));
        assert_eq!(Sparse::from_code(0), None);
        assert_eq!(Sparse::from_code(8), None);
    }
}
