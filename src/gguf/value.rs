//! Metadata values: scalars, strings and compact typed arrays.
//!
//! An array is stored as one typed vector ([`MetaArray`]), never as a vector of [`MetaValue`]s,
//! so that its memory is about its size in the file: a `u8` array costs one byte per element,
//! a string array its text plus one offset per string.

use super::value_type;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// The strings of a string array, stored as one text with the end offset of each string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrArray {
    text: Box<str>,
    ends: Box<[usize]>,
}

/// Builds a [`StrArray`] one string at a time.
#[derive(Debug, Default)]
pub struct StrArrayBuilder {
    text: String,
    ends: Vec<usize>,
}

impl StrArrayBuilder {
    /// Room for `n` strings of `text_len` bytes in all.
    pub fn with_capacity(n: usize, text_len: usize) -> Self {
        StrArrayBuilder {
            text: String::with_capacity(text_len),
            ends: Vec::with_capacity(n),
        }
    }

    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    pub fn finish(self) -> StrArray {
        StrArray {
            text: self.text.into_boxed_str(),
            ends: self.ends.into_boxed_slice(),
        }
    }
}

impl StrArray {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = match i.checked_sub(1) {
            Some(p) => *self.ends.get(p)?,
            None => 0,
        };
        self.text.get(start..end)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or(""))
    }

    /// Bytes of text held.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }
}

impl<'a> FromIterator<&'a str> for StrArray {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        let mut b = StrArrayBuilder::default();
        for s in iter {
            b.push(s);
        }
        b.finish()
    }
}

/// An array value: all elements have one type, stored in one vector.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StrArray),
    /// Arrays of arrays (GGUF files nest at most one level; the reader refuses deeper ones).
    Array(Vec<MetaArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// Applies `$body` to the vector of any numeric or bool array, as `$v`.
macro_rules! each_vec {
    ($self:expr, $v:ident => $body:expr, str $s:ident => $sbody:expr, arr $a:ident => $abody:expr) => {
        match $self {
            MetaArray::U8($v) => $body,
            MetaArray::I8($v) => $body,
            MetaArray::U16($v) => $body,
            MetaArray::I16($v) => $body,
            MetaArray::U32($v) => $body,
            MetaArray::I32($v) => $body,
            MetaArray::F32($v) => $body,
            MetaArray::Bool($v) => $body,
            MetaArray::U64($v) => $body,
            MetaArray::I64($v) => $body,
            MetaArray::F64($v) => $body,
            MetaArray::String($s) => $sbody,
            MetaArray::Array($a) => $abody,
        }
    };
}

impl MetaArray {
    pub fn len(&self) -> usize {
        each_vec!(self, v => v.len(), str s => s.len(), arr a => a.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF type id of the elements (see [`value_type`]).
    pub fn elem_type(&self) -> u32 {
        use value_type::*;
        match self {
            MetaArray::U8(_) => UINT8,
            MetaArray::I8(_) => INT8,
            MetaArray::U16(_) => UINT16,
            MetaArray::I16(_) => INT16,
            MetaArray::U32(_) => UINT32,
            MetaArray::I32(_) => INT32,
            MetaArray::F32(_) => FLOAT32,
            MetaArray::Bool(_) => BOOL,
            MetaArray::String(_) => STRING,
            MetaArray::Array(_) => ARRAY,
            MetaArray::U64(_) => UINT64,
            MetaArray::I64(_) => INT64,
            MetaArray::F64(_) => FLOAT64,
        }
    }

    /// Element `i` as a value (strings and inner arrays are copied); `None` past the end.
    pub fn get(&self, i: usize) -> Option<MetaValue> {
        Some(match self {
            MetaArray::U8(v) => MetaValue::U8(*v.get(i)?),
            MetaArray::I8(v) => MetaValue::I8(*v.get(i)?),
            MetaArray::U16(v) => MetaValue::U16(*v.get(i)?),
            MetaArray::I16(v) => MetaValue::I16(*v.get(i)?),
            MetaArray::U32(v) => MetaValue::U32(*v.get(i)?),
            MetaArray::I32(v) => MetaValue::I32(*v.get(i)?),
            MetaArray::F32(v) => MetaValue::F32(*v.get(i)?),
            MetaArray::Bool(v) => MetaValue::Bool(*v.get(i)?),
            MetaArray::U64(v) => MetaValue::U64(*v.get(i)?),
            MetaArray::I64(v) => MetaValue::I64(*v.get(i)?),
            MetaArray::F64(v) => MetaValue::F64(*v.get(i)?),
            MetaArray::String(s) => MetaValue::String(s.get(i)?.to_owned()),
            MetaArray::Array(a) => MetaValue::Array(a.get(i)?.clone()),
        })
    }

    /// Every element as a value (strings and inner arrays are copied).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = MetaValue> + '_ {
        (0..self.len())
            .filter_map(|i| self.get(i))
            .collect::<Vec<_>>()
            .into_iter()
    }

    /// The strings of a string array.
    pub fn as_str_array(&self) -> Option<&StrArray> {
        match self {
            MetaArray::String(s) => Some(s),
            _ => None,
        }
    }

    /// Element `i` as an f32 (any integer or float type); `None` for other types or past the end.
    pub(crate) fn number_f32(&self, i: usize) -> Option<f32> {
        match self {
            MetaArray::F32(v) => v.get(i).copied(),
            MetaArray::F64(v) => v.get(i).map(|&x| x as f32),
            MetaArray::U64(v) => v.get(i).map(|&x| x as f32),
            _ => self.integer_i64(i).map(|x| x as f32),
        }
    }

    /// Element `i` as an i64 (any integer type that fits); `None` otherwise.
    pub(crate) fn integer_i64(&self, i: usize) -> Option<i64> {
        match self {
            MetaArray::U8(v) => v.get(i).map(|&x| x.into()),
            MetaArray::I8(v) => v.get(i).map(|&x| x.into()),
            MetaArray::U16(v) => v.get(i).map(|&x| x.into()),
            MetaArray::I16(v) => v.get(i).map(|&x| x.into()),
            MetaArray::U32(v) => v.get(i).map(|&x| x.into()),
            MetaArray::I32(v) => v.get(i).map(|&x| x.into()),
            MetaArray::I64(v) => v.get(i).copied(),
            MetaArray::U64(v) => v.get(i).and_then(|&x| i64::try_from(x).ok()),
            _ => None,
        }
    }

    /// Builds an array from values, which must all have one type (an empty list gives an empty
    /// `u8` array). Returns the index of the first value whose type differs.
    pub fn try_from_values(values: Vec<MetaValue>) -> Result<Self, usize> {
        let Some(first) = values.first() else {
            return Ok(MetaArray::U8(Vec::new()));
        };
        let ty = first.type_id();
        if let Some(i) = values.iter().position(|v| v.type_id() != ty) {
            return Err(i);
        }
        macro_rules! collect {
            ($variant:ident) => {
                MetaArray::$variant(
                    values
                        .into_iter()
                        .filter_map(|v| match v {
                            MetaValue::$variant(x) => Some(x),
                            _ => None,
                        })
                        .collect(),
                )
            };
        }
        Ok(match first {
            MetaValue::U8(_) => collect!(U8),
            MetaValue::I8(_) => collect!(I8),
            MetaValue::U16(_) => collect!(U16),
            MetaValue::I16(_) => collect!(I16),
            MetaValue::U32(_) => collect!(U32),
            MetaValue::I32(_) => collect!(I32),
            MetaValue::F32(_) => collect!(F32),
            MetaValue::Bool(_) => collect!(Bool),
            MetaValue::U64(_) => collect!(U64),
            MetaValue::I64(_) => collect!(I64),
            MetaValue::F64(_) => collect!(F64),
            MetaValue::Array(_) => collect!(Array),
            MetaValue::String(_) => MetaArray::String(
                values
                    .iter()
                    .filter_map(|v| match v {
                        MetaValue::String(s) => Some(s.as_str()),
                        _ => None,
                    })
                    .collect(),
            ),
        })
    }
}

/// Collects values of one type into an array.
///
/// # Panics
/// If the values mix element types (a GGUF array cannot hold them); use
/// [`MetaArray::try_from_values`] for values that do not come from code.
impl FromIterator<MetaValue> for MetaArray {
    fn from_iter<I: IntoIterator<Item = MetaValue>>(iter: I) -> Self {
        let values: Vec<MetaValue> = iter.into_iter().collect();
        match MetaArray::try_from_values(values) {
            Ok(a) => a,
            Err(i) => panic!("GGUF arrays hold a single element type (element {i} differs)"),
        }
    }
}

/// See the [`FromIterator`] implementation for the panic on mixed types.
impl From<Vec<MetaValue>> for MetaArray {
    fn from(values: Vec<MetaValue>) -> Self {
        values.into_iter().collect()
    }
}

macro_rules! from_vec {
    ($($t:ty => $variant:ident),*) => {$(
        impl From<Vec<$t>> for MetaArray {
            fn from(v: Vec<$t>) -> Self {
                MetaArray::$variant(v)
            }
        }
    )*};
}
from_vec!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, u64 => U64, i64 => I64, f64 => F64);

impl From<Vec<String>> for MetaArray {
    fn from(v: Vec<String>) -> Self {
        MetaArray::String(v.iter().map(String::as_str).collect())
    }
}

impl From<Vec<&str>> for MetaArray {
    fn from(v: Vec<&str>) -> Self {
        MetaArray::String(v.into_iter().collect())
    }
}

impl MetaValue {
    /// The GGUF value type id (see [`value_type`]).
    pub fn type_id(&self) -> u32 {
        use value_type::*;
        match self {
            MetaValue::U8(_) => UINT8,
            MetaValue::I8(_) => INT8,
            MetaValue::U16(_) => UINT16,
            MetaValue::I16(_) => INT16,
            MetaValue::U32(_) => UINT32,
            MetaValue::I32(_) => INT32,
            MetaValue::F32(_) => FLOAT32,
            MetaValue::Bool(_) => BOOL,
            MetaValue::String(_) => STRING,
            MetaValue::Array(_) => ARRAY,
            MetaValue::U64(_) => UINT64,
            MetaValue::I64(_) => INT64,
            MetaValue::F64(_) => FLOAT64,
        }
    }

    /// A short name of the value's type, for messages.
    pub fn type_name(&self) -> &'static str {
        value_type::name(self.type_id())
    }

    /// Any integer that fits a u64 (not negative).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any float or integer, converted to f32 (rounding if needed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            MetaValue::U64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A value for messages: its type, and the value itself when it is a scalar.
pub(crate) fn describe(v: &MetaValue) -> String {
    match v {
        MetaValue::String(_) | MetaValue::Array(_) => v.type_name().to_owned(),
        other => format!("{} {other:?}", other.type_name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn str_array_round_trip() {
        let a: StrArray = ["", "ab", "", "c"].into_iter().collect();
        assert_eq!(a.len(), 4);
        assert_eq!(a.iter().collect::<Vec<_>>(), ["", "ab", "", "c"]);
        assert_eq!(a.get(4), None);
        assert_eq!(a.text_len(), 3);
    }

    #[test]
    fn arrays_from_values() {
        let a: MetaArray = vec![MetaValue::I32(-1), MetaValue::I32(7)].into();
        assert_eq!(a, MetaArray::I32(vec![-1, 7]));
        assert_eq!(a.get(1), Some(MetaValue::I32(7)));
        assert_eq!(a.integer_i64(0), Some(-1));
        assert_eq!(a.number_f32(1), Some(7.0));
        assert_eq!(
            MetaArray::from(Vec::<MetaValue>::new()),
            MetaArray::U8(vec![])
        );
        let mixed = vec![MetaValue::U8(1), MetaValue::Bool(true)];
        assert_eq!(MetaArray::try_from_values(mixed), Err(1));
        let nested: MetaArray = vec![MetaValue::Array(MetaArray::U16(vec![1, 2]))].into();
        assert_eq!(nested.elem_type(), value_type::ARRAY);
        assert_eq!(nested.len(), 1);
        let s: MetaArray = vec!["x", "yz"].into();
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [
                MetaValue::String("x".into()),
                MetaValue::String("yz".into())
            ]
        );
        assert_eq!(MetaArray::U64(vec![u64::MAX]).integer_i64(0), None);
    }

    #[test]
    fn array_values_stay_small() {
        // The point of the compact layout: an element of a nested array costs a few words.
        assert!(std::mem::size_of::<MetaArray>() <= 40);
        assert!(std::mem::size_of::<MetaValue>() <= 48);
    }
}
