//! `recall providers`: each configured embedding provider, whether it
//! works now, its vector space, and which one the index uses.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use recall::index::store::Store;
use recall::space::Identity;
use serde_json::{Value, json};

use super::index::HermesArgs;
use super::{ModelArgs, ProviderArgs};

#[derive(Args)]
pub struct ProvidersArgs {
    #[command(flatten)]
    hermes: HermesArgs,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    providers: ProviderArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Each provider of the chain, tried now: what `recall providers` and `recall doctor` show.
pub fn survey(
    providers: &ProviderArgs,
    model: &ModelArgs,
    index: Option<&Identity>,
    store: Option<&Store>,
    remembered: Option<std::path::PathBuf>,
) -> Result<Value> {
    let config = providers.config()?;
    // A survey reads: it never downloads the model.
    let chain = providers.chain_with(model, remembered, false, true)?;
    let embedders = match (index, store) {
        (Some(index), Some(store)) => Some(recall::index::Embedders::new(&chain, index, store)?),
        _ => None,
    };
    let mut used = false;
    let mut rows = Vec::new();
    for p in chain.providers() {
        let started = Instant::now();
        let identity = p.identity();
        let ms = started.elapsed().as_millis() as u64;
        let mut row = json!({
            "name": p.name(),
            "type": p.kind().as_str(),
            "model": p.describe(),
            "ok": identity.is_ok(),
            "checked_ms": ms,
        });
        match identity {
            Ok(id) => {
                row["space"] = json!(id.space());
                row["sparse"] = json!(id.sparse);
                if let Some(embedders) = &embedders {
                    let verdict = embedders.may_write(p.as_ref());
                    row["fits_index"] = json!(verdict.is_ok());
                    match verdict {
                        Ok(()) if !used => {
                            row["used"] = json!(true);
                            used = true;
                        }
                        Ok(()) => {}
                        Err(why) => row["why_not"] = json!(why),
                    }
                }
            }
            Err(e) => row["error"] = json!(format!("{e:#}")),
        }
        rows.push(row);
    }
    Ok(json!({
        "config": config.path,
        "chain": config.chain,
        "index": index.map(|i| json!({"space": i.space(), "built_by": format!("{} {}", i.provider, i.model)})),
        "providers": rows,
    }))
}

pub fn run(args: ProvidersArgs) -> Result<()> {
    let index_path = args.hermes.index_path()?;
    let store = index_path
        .is_file()
        .then(|| Store::open_existing(&index_path))
        .transpose()?;
    let identity = store.as_ref().map(|s| s.identity()).transpose()?.flatten();
    let remembered = store.as_ref().map(|s| s.model_dir()).transpose()?.flatten();
    let survey = survey(
        &args.providers,
        &args.model,
        identity.as_ref(),
        store.as_ref(),
        remembered,
    )?;
    if args.json {
        println!("{survey}");
        return Ok(());
    }
    print(&survey, &index_path.display().to_string());
    Ok(())
}

pub fn print(survey: &Value, index_path: &str) {
    println!(
        "config: {}",
        survey["config"]
            .as_str()
            .unwrap_or("none (built-in providers; see `recall providers --help`)")
    );
    let chain: Vec<&str> = survey["chain"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    println!("chain:  {}", chain.join(" → "));
    match &survey["index"] {
        Value::Null => println!(
            "index:  none yet at {index_path} (the first provider that works will set its space)"
        ),
        i => println!(
            "index:  {index_path}: {} (built by {})",
            space_text(&i["space"]),
            i["built_by"].as_str().unwrap_or("?")
        ),
    }
    for p in survey["providers"].as_array().into_iter().flatten() {
        let state = if p["ok"] == true {
            let mut s = format!("ok ({} ms), {}", p["checked_ms"], space_text(&p["space"]));
            match (p["fits_index"].as_bool(), p["used"] == true) {
                (Some(true), true) => s.push_str("  ← embeds for the index"),
                (Some(true), false) => s.push_str("  (fallback of the index's space)"),
                (Some(false), _) => s.push_str(
                    "  (another space or model: only for a new index, `recall index --rebuild`)",
                ),
                (None, _) => {}
            }
            s
        } else {
            format!("unavailable: {}", p["error"].as_str().unwrap_or("?"))
        };
        println!(
            "  {:<8} {:<7} {}\n           {state}",
            p["name"].as_str().unwrap_or("?"),
            p["type"].as_str().unwrap_or("?"),
            p["model"].as_str().unwrap_or("?")
        );
    }
}

fn space_text(space: &Value) -> String {
    format!(
        "{}, {} dims",
        space["family"].as_str().unwrap_or("?"),
        space["dimension"]
    )
}
