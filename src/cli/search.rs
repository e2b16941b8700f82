//! `recall search` and `recall show`.

use anyhow::{Context, Result, bail};
use clap::Args;
use recall::index::store::Store;
use recall::search::vector::Strategy;
use recall::search::{self, Filters, Fusion, SearchOptions, Signals};
use recall::source::hermes::StateDb;

use super::index::HermesArgs;
use super::{ModelArgs, ProviderArgs};

#[derive(Args)]
pub struct SearchArgs {
    /// What to look for, in any language: a question, a description, or an exact identifier.
    /// `-` reads it from standard input (a query that starts with `-` can also follow `--`).
    query: String,
    /// Sessions to return.
    #[arg(long, short = 'n', default_value_t = 5, help_heading = "Output")]
    limit: usize,
    /// One JSON object per result (fields in docs/search.md).
    #[arg(long, help_heading = "Output")]
    json: bool,
    /// Only messages of these roles (comma-separated: user, assistant, tool).
    #[arg(long, value_delimiter = ',', help_heading = "Filters")]
    role: Vec<String>,
    /// Only sessions from these sources (comma-separated: cli, telegram, cron, ...).
    #[arg(long, value_delimiter = ',', help_heading = "Filters")]
    source: Vec<String>,
    /// Only messages written at or after this time: YYYY-MM-DD[THH:MM[:SS]] (UTC), an RFC 3339
    /// time with an offset, Unix seconds, or a time ago (7d, 12h, 2 weeks, yesterday, today).
    #[arg(long, help_heading = "Filters")]
    since: Option<String>,
    /// Only messages written at or before this time (same forms as --since).
    #[arg(long, help_heading = "Filters")]
    until: Option<String>,
    /// Only this session (and its lineage).
    #[arg(long, help_heading = "Filters")]
    session: Option<String>,
    /// How the dense, keyword and sparse signals are combined.
    #[arg(long, value_enum, default_value_t = FusionArg::Rrf, help_heading = "Ranking")]
    fusion: FusionArg,
    /// Use all signals, or one alone: dense (meaning) or keyword (exact words).
    #[arg(long, value_enum, default_value_t = SignalsArg::Hybrid, help_heading = "Ranking")]
    signals: SignalsArg,
    /// Leave out passages less similar than this dense cosine, unless they hold the query word for
    /// word. Off by default: weak results are marked instead, as where unrelated texts sit depends on
    /// the model.
    #[arg(long, value_name = "COSINE", help_heading = "Ranking")]
    min_score: Option<f32>,
    /// Re-rank the best passages by BGE-M3's ColBERT score.
    #[arg(long, help_heading = "Ranking")]
    rerank: bool,
    /// Diversify results (maximal marginal relevance); λ = 1 is pure relevance.
    #[arg(long, value_name = "LAMBDA", help_heading = "Ranking")]
    mmr: Option<f32>,
    /// Favour recent sessions: a result's score halves every DAYS.
    #[arg(long, value_name = "DAYS", help_heading = "Ranking")]
    half_life: Option<f64>,
    /// How the nearest vectors are found: an exact scan of every vector, a binary first pass
    /// over 1-bit codes with exact rescoring, or by index size (exact below 10,000 chunks).
    #[arg(long, value_enum, default_value_t = VectorScan::Auto, help_heading = "Ranking")]
    scan: VectorScan,
    #[command(flatten)]
    hermes: HermesArgs,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    providers: ProviderArgs,
}

/// `--fusion`: `search::Fusion` on the command line.
#[derive(Clone, Copy, clap::ValueEnum)]
enum FusionArg {
    /// Reciprocal rank fusion of the three signals.
    Rrf,
    /// 0.7 × dense cosine + 0.3 × keyword score, as openClaw's memorySearch.
    Weighted,
}

impl From<FusionArg> for Fusion {
    fn from(f: FusionArg) -> Self {
        match f {
            FusionArg::Rrf => Fusion::Rrf,
            FusionArg::Weighted => Fusion::Weighted,
        }
    }
}

/// `--signals`: `search::Signals` on the command line.
#[derive(Clone, Copy, clap::ValueEnum)]
enum SignalsArg {
    Hybrid,
    Dense,
    Keyword,
}

impl From<SignalsArg> for Signals {
    fn from(s: SignalsArg) -> Self {
        match s {
            SignalsArg::Hybrid => Signals::Hybrid,
            SignalsArg::Dense => Signals::Dense,
            SignalsArg::Keyword => Signals::Keyword,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum VectorScan {
    Auto,
    Exact,
    Binary,
}

/// How `recall search` starts the line that says the index lags (the Hermes
/// plugin looks for it).
const INDEX_BEHIND: &str = "note: the index lacks";

pub fn run_search(args: SearchArgs) -> Result<()> {
    let index_path = args.hermes.index_path()?;
    search_in(&index_path, args).map_err(|e| Store::explain(&index_path, e))
}

fn search_in(index_path: &std::path::Path, mut args: SearchArgs) -> Result<()> {
    if args.query == "-" {
        let mut query = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut query)
            .context("cannot read the query from standard input (it must be UTF-8)")?;
        args.query = query;
    }
    let store = Store::open_existing(index_path)?;
    let provider = query_provider(&args, &store)?;
    let options = search_options(&args)?;
    let (hits, info) = search::search(&store, provider.as_deref(), &args.query, &options)?;
    if let Some(note) = &info.note {
        eprintln!("keyword-only search: the query could not be embedded: {note}");
    }
    note_lag(&args.hermes, &store);
    if args.json {
        // Each result says how it was found, so that a keyword-only answer is never taken for more.
        for hit in &hits {
            let mut value = serde_json::to_value(hit)?;
            value["mode"] = serde_json::to_value(info.mode)?;
            println!("{value}");
        }
        return Ok(());
    }
    print_hits(&hits, &info, &args);
    Ok(())
}

/// What embeds the query: none for a keyword search or an empty index, and
/// none (said) when no provider can and a hybrid search can go on with
/// exact words.
fn query_provider(
    args: &SearchArgs,
    store: &Store,
) -> Result<Option<std::sync::Arc<dyn recall::provider::Provider>>> {
    // Someone is waiting: no 2.3 GB download, short timeouts and one retry.
    let chain = args
        .providers
        .chain_with(&args.model, store.model_dir()?, false, true)?;
    Ok(match (Signals::from(args.signals), store.identity()?) {
        (Signals::Keyword, _) | (_, None) => None,
        (_, Some(_)) => match recall::index::query_provider(&chain, store)? {
            recall::index::QueryEmbedder::Ready(p) => Some(p),
            // Keyword search still finds exact words: better than nothing, and said.
            recall::index::QueryEmbedder::Unavailable(unavailable)
                if Signals::from(args.signals) == Signals::Hybrid && !args.rerank =>
            {
                eprintln!(
                    "keyword-only search: {unavailable}\n(`recall providers` shows each provider's state)"
                );
                None
            }
            recall::index::QueryEmbedder::Unavailable(unavailable) => bail!("{unavailable}"),
        },
    })
}

/// The search the flags ask for.
fn search_options(args: &SearchArgs) -> Result<SearchOptions> {
    let profiles = match (&args.hermes.profile_name(), args.hermes.all_profiles()) {
        (Some(p), _) => vec![p.clone()],
        (None, true) => Vec::new(),
        (None, false) => vec!["default".to_string()],
    };
    Ok(SearchOptions {
        limit: args.limit,
        fusion: args.fusion.into(),
        signals: args.signals.into(),
        min_score: args.min_score,
        rerank: args.rerank,
        mmr: args.mmr,
        half_life_days: args.half_life,
        ranking: Default::default(),
        scan: match args.scan {
            VectorScan::Auto => Strategy::Auto,
            VectorScan::Exact => Strategy::Exact,
            VectorScan::Binary => Strategy::Binary,
        },
        filters: Filters {
            roles: args.role.clone(),
            sources: args.source.clone(),
            since: args.since.as_deref().map(search::parse_time).transpose()?,
            until: args.until.as_deref().map(search::parse_time).transpose()?,
            session: args.session.clone(),
            profiles,
        },
    })
}

/// Says when the index lacks messages Hermes has written. A search never
/// fails for this look: Hermes's database may be busy.
fn note_lag(hermes: &HermesArgs, store: &Store) {
    let selection = recall::source::hermes::Selection::default();
    if let Ok(Some((lacking, since))) = hermes
        .profiles()
        .and_then(|profiles| recall::index::behind(store, &profiles, &selection))
    {
        eprintln!(
            "{INDEX_BEHIND} {lacking} messages Hermes wrote since {}: they cannot be found until \
             `recall index` runs (or keep `recall serve --watch` running)",
            search::rfc3339(since)
        );
    }
}

/// The results for a person: numbered, with where each was found and its
/// snippets, the query's words highlighted.
fn print_hits(hits: &[search::SessionHit], info: &search::SearchInfo, args: &SearchArgs) {
    if info.mode == search::Mode::Keyword && Signals::from(args.signals) != Signals::Keyword {
        println!("(keyword-only results: no embedding provider is available for this index)");
    }
    if hits.is_empty() {
        println!("no session matches (searched {} passages)", info.candidates);
        return;
    }
    if hits.iter().all(|h| h.weak) {
        println!("(only weak matches: nothing stands out as being about this)");
    }
    let color = super::style::stdout();
    for (i, hit) in hits.iter().enumerate() {
        let title = printable(hit.title.as_deref().unwrap_or("(untitled)"));
        // The fused score only orders (a rank's share); the similarity of
        // the best passage says how close it is. Without a query vector
        // there is none to show.
        let similarity = if info.mode == search::Mode::Keyword {
            String::new()
        } else {
            format!(" · similarity {:.2}", hit.similarity)
        };
        println!(
            "{}. {title}  [{} · {}{similarity}{}]",
            i + 1,
            hit.when,
            hit.source,
            if hit.weak { " · weak" } else { "" }
        );
        println!(
            "   {} (message {}, {})",
            hit.link, hit.match_message_id, hit.role
        );
        for s in std::iter::once(&hit.snippet).chain(&hit.snippets) {
            println!("   {}", highlight(&printable(s), &args.query, color));
        }
    }
}

/// `text` with its control characters shown as escapes (`\u{1b}`), so that
/// what Hermes stored can never move the cursor, recolour or clear the
/// terminal it is printed on.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `printable`, keeping line breaks and tabs.
fn printable_lines(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            line.split('\t')
                .map(printable)
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Query words in bold on a terminal.
fn highlight(text: &str, query: &str, color: bool) -> String {
    if !color {
        return text.to_string();
    }
    let mut out = text.to_string();
    for word in query.split_whitespace().filter(|w| w.chars().count() >= 2) {
        if let Some(at) = out.find(word) {
            out.replace_range(at..at + word.len(), &format!("\x1b[1m{word}\x1b[0m"));
        }
    }
    out
}

#[derive(Args)]
pub struct ShowArgs {
    /// The session id (or a `@session:<profile>/<id>` link).
    session: String,
    #[command(flatten)]
    hermes: HermesArgs,
    /// Centre the window on this message id.
    #[arg(long)]
    around: Option<i64>,
    /// Messages on each side of --around.
    #[arg(long, default_value_t = 5)]
    window: usize,
    /// Print one JSON object: the session, the window's bounds and its messages.
    #[arg(long)]
    json: bool,
}

pub fn run_show(args: ShowArgs) -> Result<()> {
    let (profile, id) = match args
        .session
        .strip_prefix("@session:")
        .and_then(|l| l.split_once('/'))
    {
        Some((p, id)) => (Some(p.to_string()), id.to_string()),
        None => (args.hermes.profile_name(), args.session.clone()),
    };
    let home = args.hermes.home()?;
    let dir = match profile.as_deref() {
        None | Some("default") => home,
        Some(p) => home.join("profiles").join(p),
    };
    let db = StateDb::open(&dir.join("state.db"))?;
    let messages = db.session_messages(&id)?;
    if messages.is_empty() {
        bail!(
            "no messages for session {id} in {}",
            dir.join("state.db").display()
        );
    }
    let title = db.sessions()?.remove(&id).and_then(|s| s.title);
    let centre = match args.around {
        Some(m) => messages
            .iter()
            .position(|x| x.id == m)
            .with_context(|| format!("message {m} is not in session {id}"))?,
        None => 0,
    };
    let start = centre.saturating_sub(if args.around.is_some() {
        args.window
    } else {
        0
    });
    let end = if args.around.is_some() {
        centre.saturating_add(args.window).saturating_add(1)
    } else {
        start
            .saturating_add(args.window.saturating_mul(2))
            .saturating_add(1)
    }
    .min(messages.len());
    if args.json {
        let window: Vec<serde_json::Value> = messages[start..end]
            .iter()
            .map(|m| {
                serde_json::json!({
                    "id": m.id, "when": search::rfc3339(m.timestamp), "role": m.role,
                    "text": m.text, "around": Some(m.id) == args.around,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "session_id": id, "profile": profile.as_deref().unwrap_or("default"),
                "title": title,
                "first": start + 1, "last": end, "total": messages.len(), "messages": window,
            })
        );
        return Ok(());
    }
    println!(
        "session {}{}: messages {}–{} of {}",
        printable(&id),
        title
            .as_deref()
            .map(|t| format!(" \"{}\"", printable(t)))
            .unwrap_or_default(),
        start + 1,
        end,
        messages.len()
    );
    for m in &messages[start..end] {
        let mark = if Some(m.id) == args.around { ">" } else { " " };
        println!(
            "{mark} [{}] {} {}: {}",
            m.id,
            search::rfc3339(m.timestamp),
            printable(&m.role),
            printable_lines(&m.text)
        );
    }
    Ok(())
}
