//! GGUF metadata values.

use std::fmt;

/// The type tag of a metadata value (`gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// 8-bit unsigned.
    U8,
    /// 8-bit signed.
    I8,
    /// 16-bit unsigned.
    U16,
    /// 16-bit signed.
    I16,
    /// 32-bit unsigned.
    U32,
    /// 32-bit signed.
    I32,
    /// 32-bit float.
    F32,
    /// One byte, 0 or 1.
    Bool,
    /// Length-prefixed UTF-8 string.
    String,
    /// Typed array (may nest).
    Array,
    /// 64-bit unsigned.
    U64,
    /// 64-bit signed.
    I64,
    /// 64-bit float.
    F64,
}

impl ValueType {
    /// The type for a numeric tag, if valid.
    pub fn from_tag(tag: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match tag {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The numeric tag written to files.
    pub fn tag(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// The fewest bytes one value of this type occupies in a file; used to
    /// bound element counts before anything is allocated.
    pub fn min_encoded_len(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// 8-bit unsigned.
    U8(u8),
    /// 8-bit signed.
    I8(i8),
    /// 16-bit unsigned.
    U16(u16),
    /// 16-bit signed.
    I16(i16),
    /// 32-bit unsigned.
    U32(u32),
    /// 32-bit signed.
    I32(i32),
    /// 32-bit float.
    F32(f32),
    /// Boolean.
    Bool(bool),
    /// String.
    String(String),
    /// Array of values that all have `elem` as their type.
    Array(ValueType, Vec<Value>),
    /// 64-bit unsigned.
    U64(u64),
    /// 64-bit signed.
    I64(i64),
    /// 64-bit float.
    F64(f64),
}

impl Value {
    /// The type tag of this value.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as an unsigned integer, for any integer type holding a
    /// non-negative number.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, for float types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice, for strings.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, for arrays.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    /// Short human form; long arrays are summarised.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) if s.len() > 60 => {
                write!(f, "{:?}... ({} bytes)", &s[..s.floor_char_boundary(60)], s.len())
            }
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(t, v) if v.len() > 8 => write!(f, "[{:?} x {}]", t, v.len()),
            Value::Array(_, v) => {
                write!(f, "[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{x}")?;
                }
                write!(f, "]")
            }
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}
