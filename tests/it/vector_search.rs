//! The binary first pass of vector search (code file + exact rescoring)
//! against sqlite-vec's exact scan, and the code file kept in step with the
//! index through appends, deletions, damage and replacement.

use std::collections::HashSet;
use std::path::Path;

use recall::bench::synthetic_vector_index;
use recall::index::store::{ChunkRow, MessageRow, Store};
use recall::search::binary::{CodeFile, path_for};
use recall::search::vector::{Strategy, knn};

const DIM: usize = 256;

fn top_ids(store: &Store, q: &[f32], strategy: Strategy) -> Vec<i64> {
    knn(store, q, 10, strategy)
        .unwrap()
        .into_iter()
        .map(|h| h.0)
        .collect()
}

fn recall_at_10(store: &Store, queries: &[Vec<f32>]) -> f64 {
    let mut found = 0;
    for q in queries {
        let truth: HashSet<i64> = top_ids(store, q, Strategy::Exact).into_iter().collect();
        found += top_ids(store, q, Strategy::Binary)
            .iter()
            .filter(|id| truth.contains(id))
            .count();
    }
    found as f64 / (10 * queries.len()) as f64
}

fn message(id: i64, v: Vec<f32>) -> MessageRow {
    MessageRow {
        id,
        session_id: "added".into(),
        role: "user".into(),
        timestamp: 0.0,
        fingerprint: String::new(),
        chunks: vec![ChunkRow {
            text: format!("added passage {id}"),
            tokens: 3,
            dense: v,
            sparse: None,
        }],
        skipped_bytes: 0,
    }
}

fn namespace(store: &Store) -> String {
    store.identity().unwrap().unwrap().embedding_key()
}

fn index(dir: &Path, size: usize) -> (Store, Vec<Vec<f32>>) {
    synthetic_vector_index(&dir.join("index.db"), size, DIM, 20).unwrap()
}

#[test]
fn binary_first_pass_finds_what_the_exact_scan_finds() {
    let dir = tempfile::tempdir().unwrap();
    let (store, queries) = index(dir.path(), 20_000);
    assert!(queries.len() >= 10);
    let recall = recall_at_10(&store, &queries);
    println!("recall@10 of the binary path: {recall:.3}");
    assert!(recall >= 0.99, "recall@10 {recall}");
    // The distances are exact, not estimates.
    let exact = knn(&store, &queries[0], 10, Strategy::Exact).unwrap();
    let binary = knn(&store, &queries[0], 10, Strategy::Binary).unwrap();
    for (id, d) in &binary {
        if let Some((_, e)) = exact.iter().find(|h| h.0 == *id) {
            assert!((d - e).abs() < 1e-4, "chunk {id}: {d} vs {e}");
        }
    }
    // At this size `Auto` takes the binary path.
    assert_eq!(
        top_ids(&store, &queries[1], Strategy::Auto),
        top_ids(&store, &queries[1], Strategy::Binary)
    );
}

#[test]
fn code_file_follows_appends_and_deletions() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, queries) = index(dir.path(), 3_000);
    assert_eq!(CodeFile::open(&store).unwrap().len(), 3_000);
    let ns = namespace(&store);

    // A new chunk equal to a query is the nearest: found through an append.
    let wanted = queries[0].clone();
    store
        .put_messages("bench", &ns, &[message(1_000_000, wanted.clone())])
        .unwrap();
    let new_id: i64 = store
        .conn()
        .query_row("SELECT max(id) FROM chunks", [], |r| r.get(0))
        .unwrap();
    let codes_before = std::fs::metadata(path_for(store.path())).unwrap().len();
    assert_eq!(top_ids(&store, &wanted, Strategy::Binary)[0], new_id);
    assert_eq!(CodeFile::open(&store).unwrap().len(), 3_001);
    assert!(std::fs::metadata(path_for(store.path())).unwrap().len() > codes_before);

    // Deleted, it is never returned, and the file is rewritten without it.
    store.delete_messages("bench", &[1_000_000]).unwrap();
    assert!(!top_ids(&store, &wanted, Strategy::Binary).contains(&new_id));
    assert_eq!(CodeFile::open(&store).unwrap().len(), 3_000);

    // An edit (delete + insert of the same message) is followed too.
    let moved = queries[1].clone();
    store
        .put_messages("bench", &ns, &[message(1, moved.clone())])
        .unwrap();
    let edited: i64 = store
        .conn()
        .query_row(
            "SELECT id FROM chunks WHERE profile = 'bench' AND message_id = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(top_ids(&store, &moved, Strategy::Binary)[0], edited);
    assert_eq!(
        top_ids(&store, &moved, Strategy::Binary),
        top_ids(&store, &moved, Strategy::Exact)
    );
}

#[test]
fn damaged_or_foreign_code_files_are_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let (store, queries) = index(dir.path(), 2_000);
    // What a freshly written code file gives.
    let want = top_ids(&store, &queries[0], Strategy::Binary);
    let codes = path_for(store.path());

    // Truncated mid-record, then garbage.
    CodeFile::open(&store).unwrap();
    let len = std::fs::metadata(&codes).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&codes)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    assert_eq!(top_ids(&store, &queries[0], Strategy::Binary), want);
    std::fs::write(&codes, b"not a code file").unwrap();
    assert_eq!(top_ids(&store, &queries[0], Strategy::Binary), want);
    assert_eq!(CodeFile::open(&store).unwrap().len(), 2_000);

    // Random bytes over the records, the header intact: found by the
    // checksum, and the file rewritten from the index.
    let intact = std::fs::read(&codes).unwrap();
    let mut damaged = intact.clone();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for b in &mut damaged[128..] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *b = state as u8;
    }
    std::fs::write(&codes, &damaged).unwrap();
    assert_eq!(top_ids(&store, &queries[0], Strategy::Binary), want);
    assert_eq!(
        std::fs::read(&codes).unwrap(),
        intact,
        "rewritten as it was"
    );
    // One flipped bit is found too.
    let mut flipped = intact.clone();
    flipped[128 + 8 * 136 + 3] ^= 0x10;
    std::fs::write(&codes, &flipped).unwrap();
    CodeFile::open(&store).unwrap();
    assert_eq!(std::fs::read(&codes).unwrap(), intact);

    // Another index at the same path (same epoch, fewer chunks) does not reuse it.
    let old = std::fs::read(&codes).unwrap();
    drop(store);
    let other = dir.path().join("other.db");
    drop(synthetic_vector_index(&other, 1_500, DIM, 20).unwrap());
    std::fs::rename(&other, dir.path().join("index.db")).unwrap();
    std::fs::write(&codes, &old).unwrap();
    let store = Store::open(&dir.path().join("index.db")).unwrap();
    assert_eq!(CodeFile::open(&store).unwrap().len(), 1_500);
    let mine = top_ids(&store, &queries[0], Strategy::Binary);
    assert!(mine.iter().all(|id| *id <= 1_500), "{mine:?}");
    std::fs::remove_file(&codes).unwrap();
    assert_eq!(top_ids(&store, &queries[0], Strategy::Binary), mine);
}

#[test]
fn without_a_writable_code_file_auto_scans_exactly_and_binary_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (store, queries) = index(dir.path(), 10_000);
    let codes = path_for(store.path());
    let _ = std::fs::remove_file(&codes);
    std::fs::create_dir(&codes).unwrap();
    assert_eq!(
        top_ids(&store, &queries[0], Strategy::Auto),
        top_ids(&store, &queries[0], Strategy::Exact)
    );
    let err = knn(&store, &queries[0], 10, Strategy::Binary).unwrap_err();
    assert!(format!("{err:#}").contains("index.db.codes"), "{err:#}");
}

#[test]
fn a_layout_1_index_gets_its_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, queries) = index(dir.path(), 2_000);
    let want = top_ids(&store, &queries[0], Strategy::Binary);
    std::fs::remove_file(path_for(store.path())).unwrap();
    store
        .conn()
        .execute_batch("DELETE FROM chunk_codes; UPDATE meta SET value = '1' WHERE key = 'layout';")
        .unwrap();
    let path = store.path().to_path_buf();
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.layout().unwrap().as_deref(), Some("3"));
    assert_eq!(
        store.count("SELECT count(*) FROM chunk_codes").unwrap(),
        2_000
    );
    assert_eq!(top_ids(&store, &queries[0], Strategy::Binary), want);
}

#[test]
fn a_layout_2_index_gets_its_word_index() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = index(dir.path(), 300);
    // What layout 2 had: no word index, and a delete trigger without it.
    store
        .conn()
        .execute_batch(
            "DROP TRIGGER chunks_words_ai; DROP TABLE chunks_words; DROP TRIGGER chunks_ad;
             CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
                 INSERT INTO chunks_fts (chunks_fts, rowid, text) VALUES ('delete', old.id, old.text);
                 DELETE FROM chunks_vec WHERE chunk_id = old.id;
             END;
             UPDATE meta SET value = '2' WHERE key = 'layout';",
        )
        .unwrap();
    let path = store.path().to_path_buf();
    drop(store);
    let mut store = Store::open(&path).unwrap();
    assert_eq!(store.layout().unwrap().as_deref(), Some("3"));
    // Every passage is in the word index, stemmed ("passages" finds "passage").
    assert_eq!(store.word_matches("\"passages\"", 1000).unwrap().len(), 300);
    assert_eq!(store.word_matches("\"217\"", 10).unwrap().len(), 1);
    // Deleting a message deletes its words, so the index stays consistent.
    store.delete_messages("bench", &[217]).unwrap();
    assert!(store.word_matches("\"217\"", 10).unwrap().is_empty());
    store
        .conn()
        .execute_batch("INSERT INTO chunks_words (chunks_words) VALUES ('integrity-check');")
        .unwrap();
}
