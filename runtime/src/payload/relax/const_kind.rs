//! The kinds of constants of a Relax executable: what each generation's tag names
//! ([`super::v019`], [`super::v021`]), a leaf both the tag tables and the reader use.

/// The kinds of constants (what a tag names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConstKind {
    Tensor,
    DataType,
    Shape,
    Str,
    Int,
    Float,
}
