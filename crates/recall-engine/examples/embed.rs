//! The engine on its own: loads a model directory and prints each text's
//! dense vector size, its strongest sparse weights and its ColBERT vectors,
//! then the pairwise dense scores.
//!
//! `cargo run -p recall-engine --example embed -- MODEL_DIR TEXT [TEXT ...]`
//! (`models/tiny-bge-m3` in this repository is a BGE-M3 of random weights).

use recall_engine::{Embedder, LoadOptions, Outputs, score};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: embed MODEL_DIR TEXT [TEXT ...]";
    let dir = args.next().ok_or(usage)?;
    let texts: Vec<String> = args.collect();
    if texts.is_empty() {
        return Err(usage.into());
    }
    let embedder = Embedder::load(dir.as_ref(), &LoadOptions::default())?;
    let info = embedder.info();
    // Sparse and ColBERT outputs need BGE-M3's heads; other models give dense only.
    let outputs = if info.sparse {
        Outputs::ALL
    } else {
        Outputs::DENSE
    };
    let embedded = embedder.embed(&texts, outputs)?;
    for (text, e) in texts.iter().zip(&embedded) {
        println!("{text:?}: {} tokens", e.tokens);
        if let Some(dense) = &e.dense {
            println!("  dense: {} dimensions", dense.len());
        }
        if let Some(sparse) = &e.sparse {
            let mut strongest: Vec<(u32, f32)> = sparse.iter().map(|(&t, &w)| (t, w)).collect();
            strongest.sort_by(|a, b| b.1.total_cmp(&a.1));
            let shown: Vec<String> = strongest
                .iter()
                .take(5)
                .map(|(t, w)| {
                    let token = embedder.tokenizer().token(*t).unwrap_or_default();
                    format!("{token}={w:.3}")
                })
                .collect();
            println!("  sparse: {}", shown.join(" "));
        }
        if let Some(colbert) = &e.colbert {
            println!("  colbert: {} vectors", colbert.len());
        }
    }
    for (i, a) in embedded.iter().enumerate() {
        for (j, b) in embedded.iter().enumerate().skip(i + 1) {
            if let (Some(a), Some(b)) = (&a.dense, &b.dense) {
                println!("dense score {i}-{j}: {:.4}", score::dense(a, b));
            }
        }
    }
    Ok(())
}
