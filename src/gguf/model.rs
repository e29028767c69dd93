//! A model as a set of GGUF shards, with each tensor resolved to (shard, offset).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::read::{GgufFile, TensorInfo, parse_split_path, split_path};
use super::{GgufError, Value};

/// Where one tensor's bytes live.
#[derive(Debug, Clone, Copy)]
pub struct TensorLocation<'a> {
    /// Index of the shard holding the tensor (0 for single-file models).
    pub shard: usize,
    /// The tensor's table entry.
    pub info: &'a TensorInfo,
    /// Absolute byte offset of the data in the shard file.
    pub file_offset: u64,
}

/// A single GGUF file or a complete `-NNNNN-of-MMMMM` split set.
#[derive(Debug)]
pub struct ModelFiles {
    paths: Vec<PathBuf>,
    shards: Vec<GgufFile>,
    index: HashMap<String, (usize, usize)>,
}

impl ModelFiles {
    /// Opens a model. For a split set pass the first shard; every sibling must
    /// be present and agree on `split.count`.
    pub fn open(path: &Path) -> Result<ModelFiles, GgufError> {
        // The first file's own error when it is missing; a sibling's is named as one.
        ModelFiles::open_with(path, |p| if p == path || p.exists() { GgufFile::open(p).map(Some) } else { Ok(None) })
    }

    /// Opens a model whose shards' headers come from `load` (`None`: no
    /// such shard), as [`ModelFiles::open`] does with files on disk; a
    /// model on the hub is read this way, its paths the repository's names.
    pub fn open_with(
        path: &Path,
        mut load: impl FnMut(&Path) -> Result<Option<GgufFile>, GgufError>,
    ) -> Result<ModelFiles, GgufError> {
        let first = load(path)?.ok_or_else(|| GgufError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })?;
        let declared = first.get_u64("split.count").unwrap_or(1);
        let paths = match parse_split_path(path) {
            Some((prefix, no, count)) if count > 1 || declared > 1 => {
                if no != 1 {
                    return Err(split_error(path, format!("this is shard {no} of {count}; pass the first shard")));
                }
                if u64::from(count) != declared {
                    return Err(split_error(
                        path,
                        format!("file name says {count} shards, split.count says {declared}"),
                    ));
                }
                (1..=count).map(|i| split_path(&prefix, i, count)).collect()
            }
            _ if declared > 1 => {
                return Err(split_error(
                    path,
                    format!("split.count is {declared} but the name does not end in -00001-of-{declared:05}.gguf"),
                ));
            }
            _ => vec![path.to_path_buf()],
        };
        let mut shards = vec![first];
        for (i, p) in paths.iter().enumerate().skip(1) {
            let Some(shard) = load(p)? else {
                return Err(split_error(p, format!("shard {} of {} is missing", i + 1, paths.len())));
            };
            let found = shard.get("split.no");
            if found.and_then(Value::as_u64) != Some(i as u64) {
                let found = found.map_or_else(|| "missing".to_string(), Value::to_string);
                return Err(split_error(
                    p,
                    format!(
                        "split.no is {found}; expected {i} (this is shard {} of {}, and split.no counts from 0)",
                        i + 1,
                        paths.len()
                    ),
                ));
            }
            let count = shard.get("split.count");
            if count.and_then(Value::as_u64) != Some(declared) {
                let count = count.map_or_else(|| "missing".to_string(), Value::to_string);
                return Err(split_error(
                    p,
                    format!(
                        "split.count is {count}; expected {declared}, as the first shard says (this is shard {})",
                        i + 1
                    ),
                ));
            }
            shards.push(shard);
        }
        let mut index = HashMap::new();
        for (s, shard) in shards.iter().enumerate() {
            for (t, info) in shard.tensors().iter().enumerate() {
                if index.insert(info.name.clone(), (s, t)).is_some() {
                    return Err(split_error(&paths[s], format!("tensor {} appears in more than one shard", info.name)));
                }
            }
        }
        if let Some(expected) = shards[0].get_u64("split.tensors.count")
            && expected != index.len() as u64
        {
            return Err(split_error(
                path,
                format!("split.tensors.count is {expected} but the shards hold {}", index.len()),
            ));
        }
        Ok(ModelFiles { paths, shards, index })
    }

    /// The first shard, which carries the model metadata.
    pub fn meta(&self) -> &GgufFile {
        &self.shards[0]
    }

    /// Shard file paths in order.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Parsed shards in order.
    pub fn shards(&self) -> &[GgufFile] {
        &self.shards
    }

    /// Total bytes over all shard files.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.file_size).sum()
    }

    /// Every tensor with its location.
    pub fn tensors(&self) -> impl Iterator<Item = TensorLocation<'_>> {
        self.shards.iter().enumerate().flat_map(|(s, shard)| {
            shard.tensors().iter().map(move |info| TensorLocation {
                shard: s,
                info,
                file_offset: shard.data_offset + info.offset,
            })
        })
    }

    /// Where the tensor named `name` lives.
    pub fn locate(&self, name: &str) -> Option<TensorLocation<'_>> {
        let &(s, t) = self.index.get(name)?;
        let shard = &self.shards[s];
        let info = &shard.tensors()[t];
        Some(TensorLocation { shard: s, info, file_offset: shard.data_offset + info.offset })
    }
}

fn split_error(path: &Path, reason: String) -> GgufError {
    GgufError::Invalid { path: Some(path.to_path_buf()), offset: 0, field: "split set".into(), reason }
}
