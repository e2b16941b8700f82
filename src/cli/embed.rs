//! `recall embed`: texts in, JSON lines out.

use std::io::{BufWriter, IsTerminal, Read, Write};

use anyhow::{Context, Result, bail};
use clap::Args;
use recall::{Embedder, Embedding, Outputs};
use serde_json::{Value, json};

use super::ModelArgs;

#[derive(Args)]
pub struct EmbedArgs {
    /// Texts to embed. Without any, texts are read from standard input, one per line.
    texts: Vec<String>,
    #[command(flatten)]
    model: ModelArgs,
    /// Also output BGE-M3's sparse lexical weights (token id, token, weight).
    #[arg(long)]
    sparse: bool,
    /// Also output BGE-M3's ColBERT vectors (one per token after <s>).
    #[arg(long)]
    colbert: bool,
    /// Leave the dense vector out (with --sparse or --colbert).
    #[arg(long)]
    no_dense: bool,
}

/// Reads one text per line; a line that is not UTF-8 is an error naming it.
fn read_lines(mut input: impl Read) -> Result<Vec<String>> {
    let mut bytes = Vec::new();
    input
        .read_to_end(&mut bytes)
        .context("cannot read standard input")?;
    let mut lines = Vec::new();
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text = std::str::from_utf8(line).map_err(|e| {
            anyhow::anyhow!("standard input line {} is not valid UTF-8: {e}", n + 1)
        })?;
        lines.push(text.to_string());
    }
    // A final newline ends the last line; it does not start an empty one.
    if bytes.ends_with(b"\n") || bytes.is_empty() {
        lines.pop();
    }
    Ok(lines)
}

fn to_json(index: usize, e: &Embedding, embedder: &Embedder) -> Value {
    let mut obj = json!({ "index": index, "tokens": e.tokens, "truncated": e.truncated });
    if let Some(dense) = &e.dense {
        obj["dense"] = json!(dense);
    }
    if let Some(sparse) = &e.sparse {
        let mut weights: Vec<(&u32, &f32)> = sparse.iter().collect();
        weights.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
        obj["sparse"] = weights
            .into_iter()
            .map(|(id, w)| json!({ "id": id, "token": embedder.tokenizer().token(*id), "weight": w }))
            .collect();
    }
    if let Some(colbert) = &e.colbert {
        obj["colbert"] = json!(colbert);
    }
    obj
}

pub fn run(args: EmbedArgs) -> Result<()> {
    let outputs = Outputs {
        dense: !args.no_dense,
        sparse: args.sparse,
        colbert: args.colbert,
    };
    if !(outputs.dense || outputs.sparse || outputs.colbert) {
        bail!("--no-dense leaves nothing to output: add --sparse or --colbert");
    }
    let texts = if !args.texts.is_empty() {
        args.texts
    } else if std::io::stdin().is_terminal() {
        bail!("no input: pass texts as arguments, or pipe them on standard input, one per line");
    } else {
        let lines = read_lines(std::io::stdin().lock())?;
        if lines.is_empty() {
            bail!("no input: standard input was empty");
        }
        lines
    };
    let embedder = args.model.load()?;
    embedder.check_outputs(outputs)?;
    let embeddings = embedder.embed(&texts, outputs)?;
    let truncated = embeddings.iter().filter(|e| e.truncated).count();
    if truncated > 0 {
        eprintln!(
            "warning: {truncated} of {} inputs were longer than {} tokens and were truncated (--max-length)",
            embeddings.len(),
            embedder.info().max_length
        );
    }
    let mut out = BufWriter::new(std::io::stdout().lock());
    for (i, e) in embeddings.iter().enumerate() {
        serde_json::to_writer(&mut out, &to_json(i, e, &embedder))?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::read_lines;

    #[test]
    fn lines_are_split_and_checked() {
        assert_eq!(read_lines(&b"a\r\nb\n"[..]).unwrap(), vec!["a", "b"]);
        assert_eq!(read_lines(&b"a\n\nb"[..]).unwrap(), vec!["a", "", "b"]);
        assert!(read_lines(&b""[..]).unwrap().is_empty());
        let err = read_lines(&b"ok\n\xff\xfe\n"[..]).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
