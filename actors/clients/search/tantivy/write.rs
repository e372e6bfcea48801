//! Writes the local tantivy index: the one code path by which `lacuna index` (a bulk replace),
//! `lacuna ingest` and `serve`'s document routes change a corpus. Changes become searchable at the
//! commit, to every reader of the folder, in this process or another (`read` follows commits).
//! Tantivy lets one writer hold a folder at a time: a second gets a clear error naming the first.

use std::path::Path;

use ::tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyError, Term, doc};

use super::read::TantivySearch;
use super::{Fields, commit_generation, schema};
use crate::actors::clients::search::documents::Document;
use crate::actors::clients::search::{SearchError, corpus_error, for_each_passage};

impl TantivySearch {
    /// Replaces everything in the index at `dir` (created if need be) with a corpus JSONL file's
    /// passages, in one commit: a running reader switches from the old generation to the new one at
    /// once, and never finds the folder gone. Returns the number of passages.
    pub fn build(dir: &Path, corpus: &Path) -> Result<usize, SearchError> {
        bulk_build(dir, corpus)
    }
}

/// Memory the live writer buffers before it must flush (one indexing thread: documents arrive a few
/// at a time, and the readers are on the same cores).
const LIVE_WRITER_BYTES: usize = 50_000_000;

pub struct TantivyWriter {
    writer: IndexWriter,
    reader: IndexReader,
    fields: Fields,
}

impl TantivyWriter {
    /// The writer of the index at `dir`, which is created when the folder holds none.
    pub fn open(dir: &Path) -> Result<TantivyWriter, SearchError> {
        Self::open_with(dir, false)
    }

    /// With `bulk`, tantivy's default threads and a larger buffer: a whole corpus to index.
    fn open_with(dir: &Path, bulk: bool) -> Result<TantivyWriter, SearchError> {
        let index = if dir.join("meta.json").exists() {
            Index::open_in_dir(dir)?
        } else {
            std::fs::create_dir_all(dir).map_err(|e| SearchError::Index(format!("{}: {e}", dir.display())))?;
            Index::create_in_dir(dir, schema().0)?
        };
        if index.schema().get_field("doc").is_err() {
            return Err(SearchError::Index(format!(
                "the index at {} was built before documents could be replaced or deleted: rebuild it with \
                 `lacuna index --corpus FILE`",
                dir.display()
            )));
        }
        let writer = if bulk { index.writer(100_000_000) } else { index.writer_with_num_threads(1, LIVE_WRITER_BYTES) };
        let writer = writer.map_err(|e| locked(dir, e))?;
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        Ok(TantivyWriter { writer, reader, fields: schema().1 })
    }

    /// Adds `document`'s passages (split by `passage_words`), replacing every passage an earlier
    /// version of it had; returns how many it has now. Searchable from the next commit.
    pub fn upsert(&mut self, document: &Document, passage_words: usize) -> Result<usize, SearchError> {
        // Deletes apply to what was added before them, so the new passages below stay.
        self.delete(&document.id);
        let metadata = if document.metadata.is_empty() {
            String::new()
        } else {
            serde_json::to_string(&document.metadata).expect("metadata serialises")
        };
        let passages = document.passages(passage_words);
        for passage in &passages {
            self.add(&document.id, &passage.id, &passage.title, &passage.text, &metadata)?;
        }
        Ok(passages.len())
    }

    /// Deletes every passage of document `doc_id` (none is an error: a delete may be repeated).
    pub fn delete(&mut self, doc_id: &str) {
        self.writer.delete_term(Term::from_field_text(self.fields.doc, doc_id));
    }

    /// Makes the changes since the last commit searchable, all at once; returns the new generation.
    pub fn commit(&mut self) -> Result<String, SearchError> {
        self.writer.commit()?;
        self.reader.reload()?;
        Ok(commit_generation(&self.reader.searcher()))
    }

    /// [`commit`](Self::commit), with `payload` stored in the same commit: the changelog offsets a
    /// replica applied, so that after a restart it resumes exactly where the index's content ends.
    pub fn commit_with(&mut self, payload: &str) -> Result<String, SearchError> {
        let mut prepared = self.writer.prepare_commit()?;
        prepared.set_payload(payload);
        prepared.commit()?;
        self.reader.reload()?;
        Ok(commit_generation(&self.reader.searcher()))
    }

    /// What the last commit stored with [`commit_with`](Self::commit_with), if anything.
    pub fn payload(&self) -> Result<Option<String>, SearchError> {
        Ok(self.writer.index().load_metas()?.payload)
    }

    /// Deletes every passage, from the next commit (a replica rebuilding from the changelog).
    pub fn clear(&mut self) -> Result<(), SearchError> {
        self.writer.delete_all_documents()?;
        Ok(())
    }

    /// Live passages as of the last commit.
    pub fn passages(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    fn add(&mut self, doc_id: &str, id: &str, title: &str, text: &str, metadata: &str) -> Result<(), SearchError> {
        let f = self.fields;
        self.writer.add_document(
            doc!(f.id => id, f.title => title, f.text => text, f.doc => doc_id, f.metadata => metadata),
        )?;
        Ok(())
    }
}

/// A writer the folder's lock refused: another process writes it.
fn locked(dir: &Path, error: TantivyError) -> SearchError {
    match error {
        TantivyError::LockFailure(..) => SearchError::Index(format!(
            "the index at {} is being written by another process (a running `lacuna serve` or `lacuna ingest`): \
             send the documents to it, or wait for it to finish",
            dir.display()
        )),
        other => other.into(),
    }
}

/// `lacuna index --corpus`: the index at `dir` holds exactly the corpus's passages (each line one
/// passage, its own document), switched to in one commit. A folder whose index predates document
/// ids is rebuilt beside it and swapped in by renames, never deleted before the new one is whole.
pub fn bulk_build(dir: &Path, corpus: &Path) -> Result<usize, SearchError> {
    // Open the corpus first: a wrong path must not cost the old index.
    std::fs::File::open(corpus).map_err(|e| corpus_error(corpus, 0, e.to_string()))?;
    let outdated = dir.join("meta.json").exists() && Index::open_in_dir(dir)?.schema().get_field("doc").is_err();
    if outdated {
        let fresh = dir.with_extension(format!("building-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&fresh);
        let count = fill(&fresh, corpus)?;
        let old = dir.with_extension(format!("outdated-{}", std::process::id()));
        let io = |e: std::io::Error| SearchError::Index(format!("{}: {e}", dir.display()));
        std::fs::rename(dir, &old).map_err(io)?;
        std::fs::rename(&fresh, dir).map_err(io)?;
        // A reader of the old folder keeps its open files until it lets them go.
        let _ = std::fs::remove_dir_all(&old);
        return Ok(count);
    }
    fill(dir, corpus)
}

/// Replaces everything in the index at `dir` with the corpus's passages, in one commit.
fn fill(dir: &Path, corpus: &Path) -> Result<usize, SearchError> {
    let mut live = TantivyWriter::open_with(dir, true)?;
    live.writer.delete_all_documents()?;
    let mut count = 0;
    for_each_passage(corpus, |_, passage| {
        live.add(&passage.id, &passage.id, &passage.title, &passage.text, "")?;
        count += 1;
        Ok(())
    })?;
    live.commit()?;
    Ok(count)
}
