//! The reader against valid and hostile files: every malformed input gives
//! a clear error naming the field and byte offset, never a panic.

use super::*;

/// A small valid file: two tensors, a few metadata values of every kind.
fn sample() -> (GgufWriter, Vec<u8>) {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("qwen3moe".into()));
    w.set("a.u8", Value::U8(7));
    w.set("a.i64", Value::I64(-3));
    w.set("a.f64", Value::F64(0.5));
    w.set("a.bool", Value::Bool(true));
    w.set(
        "a.nested",
        Value::Array(
            ValueType::Array,
            vec![
                Value::Array(ValueType::I16, vec![Value::I16(1), Value::I16(-2)]),
                Value::Array(ValueType::String, vec![Value::String("x".into())]),
            ],
        ),
    );
    w.add_tensor(TensorSpec::new("t0", &[8, 2], GgmlType::F32));
    w.add_tensor(TensorSpec::new("blk.0.ffn_up_exps.weight", &[32, 2, 4], GgmlType::Q8_0));
    let mut bytes = Vec::new();
    w.write(&mut bytes, &mut |i| Ok(vec![i as u8; w.tensors()[i].size() as usize])).unwrap();
    (w, bytes)
}

fn err(bytes: &[u8]) -> String {
    match GgufFile::parse(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

/// Byte offset just after the header and metadata, where tensor infos begin.
fn tensor_table_offset(bytes: &[u8]) -> usize {
    let f = GgufFile::parse(bytes).unwrap();
    24 + f.metadata().iter().map(|(k, v)| 8 + k.len() + 4 + encoded_len(v)).sum::<usize>()
}

fn encoded_len(v: &Value) -> usize {
    match v {
        Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
        Value::U16(_) | Value::I16(_) => 2,
        Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
        Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
        Value::String(s) => 8 + s.len(),
        Value::Array(_, items) => 12 + items.iter().map(encoded_len).sum::<usize>(),
    }
}

#[test]
fn valid_file_round_trips() {
    let (w, bytes) = sample();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.get_u64("a.u8"), Some(7));
    assert_eq!(f.get("a.i64"), Some(&Value::I64(-3)));
    assert_eq!(f.get("a.nested").unwrap().as_array().unwrap().len(), 2);
    assert_eq!(f.tensors().len(), 2);
    let t = f.tensor("blk.0.ffn_up_exps.weight").unwrap();
    assert_eq!(t.size, 2 * 4 * 34);
    assert_eq!(t.offset, w.data_offsets()[1]);
    assert_eq!(f.data_offset % 32, 0);
    let data = &bytes[(f.data_offset + t.offset) as usize..][..t.size as usize];
    assert!(data.iter().all(|&b| b == 1));
    assert_eq!(bytes.len() as u64, w.file_size());
}

#[test]
fn every_truncation_is_an_error() {
    let (_, bytes) = sample();
    let f = GgufFile::parse(&bytes).unwrap();
    // Every prefix shorter than the end of the last tensor's data must fail.
    let needed = (f.data_offset + f.tensors().iter().map(|t| t.offset + t.size).max().unwrap()) as usize;
    for len in 0..needed {
        let e = GgufFile::parse(&bytes[..len]);
        assert!(e.is_err(), "prefix of {len} bytes parsed");
    }
}

#[test]
fn wrong_magic_and_version() {
    let (_, mut bytes) = sample();
    bytes[0] = b'X';
    assert!(err(&bytes).contains("magic at byte 0"), "{}", err(&bytes));
    let (_, mut bytes) = sample();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(err(&bytes).contains("version 1 is not supported"));
    bytes[4..8].copy_from_slice(&99u32.to_le_bytes());
    assert!(err(&bytes).contains("version 99"));
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let (_, mut bytes) = sample();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = err(&bytes);
    assert!(e.contains("tensor_count at byte 8") && e.contains("cannot fit"), "{e}");
    let (_, mut bytes) = sample();
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(err(&bytes).contains("kv_count at byte 16"));
    // An array claiming 2^60 elements.
    let mut w = GgufWriter::new();
    w.set("big", Value::Array(ValueType::U32, vec![Value::U32(1)]));
    let mut bytes = w.header();
    let count_at = 24 + 8 + 3 + 4 + 4;
    bytes[count_at..count_at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = err(&bytes);
    assert!(e.contains("big at byte") && e.contains("count"), "{e}");
}

#[test]
fn string_past_end_of_file() {
    let (_, mut bytes) = sample();
    // The first key's length.
    bytes[24..32].copy_from_slice(&(1u64 << 50).to_le_bytes());
    let e = err(&bytes);
    assert!(e.contains("key of metadata entry 0 at byte 32"), "{e}");
}

#[test]
fn bad_value_types_and_bools() {
    let mut w = GgufWriter::new();
    w.set("flag", Value::Bool(true));
    let mut bytes = w.header();
    let value_at = 24 + 8 + 4 + 4;
    bytes[value_at] = 2;
    assert!(err(&bytes).contains("bool byte 2"));
    bytes[value_at - 4..value_at].copy_from_slice(&77u32.to_le_bytes());
    assert!(err(&bytes).contains("unknown value type 77"));
}

#[test]
fn deep_nesting_is_refused() {
    let mut v = Value::Array(ValueType::U8, vec![Value::U8(1)]);
    for _ in 0..20 {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", v);
    assert!(err(&w.header()).contains("nested deeper"));
}

#[test]
fn tensor_offsets_past_eof_and_misaligned() {
    let (_, bytes) = sample();
    let table = tensor_table_offset(&bytes);
    // Second tensor info: name "blk.0.ffn_up_exps.weight", 3 dims.
    let t0_len = 8 + 2 + 4 + 2 * 8 + 4 + 8;
    let t1_offset_field = table + t0_len + 8 + 24 + 4 + 3 * 8 + 4;
    let mut past = bytes.clone();
    past[t1_offset_field..t1_offset_field + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let e = err(&past);
    assert!(e.contains("blk.0.ffn_up_exps.weight") && e.contains("past end of file"), "{e}");
    let mut misaligned = bytes.clone();
    misaligned[t1_offset_field..t1_offset_field + 8].copy_from_slice(&(64u64 + 4).to_le_bytes());
    assert!(err(&misaligned).contains("not a multiple of the alignment 32"));
    let mut overflow = bytes;
    overflow[t1_offset_field..t1_offset_field + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(err(&overflow).contains("past end of file"));
}

#[test]
fn bad_shapes_and_types() {
    let (_, bytes) = sample();
    let table = tensor_table_offset(&bytes);
    let ndims = table + 8 + 2;
    let mut b = bytes.clone();
    b[ndims..ndims + 4].copy_from_slice(&9u32.to_le_bytes());
    assert!(err(&b).contains("9 dimensions"));
    let mut b = bytes.clone();
    let type_at = ndims + 4 + 16;
    b[type_at..type_at + 4].copy_from_slice(&4u32.to_le_bytes());
    assert!(err(&b).contains("unknown ggml type 4"));
    let mut b = bytes.clone();
    b[ndims + 4..ndims + 12].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&b).contains("overflows"));
    // Second tensor is q8_0: a row of 33 elements is not whole blocks.
    let t1_dim0 = table + (8 + 2 + 4 + 16 + 4 + 8) + 8 + 24 + 4;
    let mut b = bytes;
    b[t1_dim0..t1_dim0 + 8].copy_from_slice(&33u64.to_le_bytes());
    assert!(err(&b).contains("whole number of q8_0 blocks"));
}

#[test]
fn duplicate_names_and_bad_alignment() {
    let mut w = GgufWriter::new();
    w.add_tensor(TensorSpec::new("same", &[4], GgmlType::F32));
    w.add_tensor(TensorSpec::new("same", &[4], GgmlType::F32));
    let mut bytes = Vec::new();
    w.write(&mut bytes, &mut |_| Ok(vec![0; 16])).unwrap();
    assert!(err(&bytes).contains("duplicate tensor name"));
    let mut w = GgufWriter::new();
    w.set("general.alignment", Value::U32(48));
    assert!(err(&w.header()).contains("general.alignment"));
}

#[test]
fn split_sets_resolve_and_a_missing_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("s");
    for i in 0..3u16 {
        let mut w = GgufWriter::new();
        if i == 0 {
            w.set("general.architecture", Value::String("qwen3moe".into()));
        }
        w.set("split.no", Value::U16(i));
        w.set("split.count", Value::U16(3));
        w.set("split.tensors.count", Value::I32(3));
        w.add_tensor(TensorSpec::new(format!("t{i}"), &[8], GgmlType::F32));
        let path = split_path(&prefix, u32::from(i) + 1, 3);
        let mut f = std::fs::File::create(&path).unwrap();
        w.write(&mut f, &mut |_| Ok(vec![i as u8; 32])).unwrap();
    }
    let first = split_path(&prefix, 1, 3);
    let m = ModelFiles::open(&first).unwrap();
    let loc = m.locate("t2").unwrap();
    assert_eq!(loc.shard, 2);
    let bytes = std::fs::read(&m.paths()[2]).unwrap();
    assert_eq!(bytes[loc.file_offset as usize], 2);
    // Not the first shard.
    let e = ModelFiles::open(&split_path(&prefix, 2, 3)).unwrap_err().to_string();
    assert!(e.contains("pass the first shard"), "{e}");
    // A missing shard is named.
    std::fs::remove_file(split_path(&prefix, 3, 3)).unwrap();
    let e = ModelFiles::open(&first).unwrap_err().to_string();
    assert!(e.contains("s-00003-of-00003.gguf") && e.contains("shard 3 of 3 is missing"), "{e}");
}

#[test]
fn split_path_parsing() {
    let p = std::path::Path::new("/m/model-00002-of-00010.gguf");
    let (prefix, no, count) = parse_split_path(p).unwrap();
    assert_eq!((prefix.to_str().unwrap(), no, count), ("/m/model", 2, 10));
    assert!(parse_split_path(std::path::Path::new("/m/model.gguf")).is_none());
    assert!(parse_split_path(std::path::Path::new("/m/model-2-of-10.gguf")).is_none());
}

#[test]
fn missing_and_empty_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let e = GgufFile::open(&missing).unwrap_err().to_string();
    assert!(e.contains("nope.gguf") && e.contains("No such file"), "{e}");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(GgufFile::open(&empty).unwrap_err().to_string().contains("file is empty"));
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Random corruption of a valid file never panics.
        #[test]
        fn random_bytes_never_panic(flips in proptest::collection::vec((0usize..400, any::<u8>()), 1..8)) {
            let (_, mut bytes) = sample();
            for (at, b) in flips {
                let i = at % bytes.len();
                bytes[i] = b;
            }
            let _ = GgufFile::parse(&bytes);
        }

        /// Arbitrary input never panics.
        #[test]
        fn arbitrary_input_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut b = bytes;
            if b.len() >= 8 {
                b[..4].copy_from_slice(b"GGUF");
                b[4..8].copy_from_slice(&3u32.to_le_bytes());
            }
            let _ = GgufFile::parse(&b);
        }
    }
}
