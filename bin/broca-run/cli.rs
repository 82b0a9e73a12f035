//! Argument parsing for `broca-run` (hand-rolled: a dozen flags do not need a crate).

use std::path::PathBuf;

pub const USAGE: &str = "\
broca-run: run one agentic turn on a durable session, streaming the answer

usage: broca-run [OPTIONS] [PROMPT | -]

  PROMPT                   the user message; - reads it from stdin
  --model PROVIDER/MODEL   catalog model to run (required for a new session; a continued
                           session defaults to the model of its last turn)
  --variant NAME           reasoning variant the model defines (e.g. high, max)
  --system TEXT            system prompt
  --session ID             session to continue (default: a fresh one, printed at start)
  --project-root DIR       project the session belongs to (default: the current directory)
  --harness NAME           harness name in the session key (default: broca-run)
  --state-root DIR         state root (default: BROCA_STATE_ROOT, else $XDG_DATA_HOME/cortexkit/broca,
                           else ~/.local/share/cortexkit/broca)
  --base-url URL           provider base URL instead of the catalog's (for mocks; needs no credential)
  --auth-bearer TOKEN      bearer credential for the provider (kept in memory, never written;
                           on the command line other users can see it: prefer the next)
  --auth-bearer-file FILE  the bearer credential read from FILE (its first line)
  --auth-method M          how the model's provider authenticates: apikey (default), chatgpt (a
                           ChatGPT subscription: OpenAI Responses models on the ChatGPT/Codex
                           backend), oauth, antigravity or sigv4 (an AWS access key as JSON
                           {access_key_id, secret_access_key, session_token?, region?}: Bedrock
                           requests signed with SigV4); names the dev-tools handle read
                           (<M>:<provider>) and overrides broca.jsonc auth_methods
  --code-assist-project P  the Google Cloud project Code Assist (antigravity) turns name when the
                           backend names none for the account (a Workspace account); default:
                           broca.jsonc code_assist.project, else GOOGLE_CLOUD_PROJECT
  --subc FILE              a subc connection file (else BROCA_LIVE_SUBC or SUBC_SOCKET): tools,
                           the catalog (fetched when the LKG is missing or stale) and, without
                           --auth-bearer or --base-url, the model's credential by its dev-tools
                           handle (BROCA_DEVTOOLS_HANDLES, else
                           ~/.config/cortexkit/broca/dev-tools-handles.json) come through it
  --tool-provider M[:P]    a tool-provider module (with preset P) in this turn's fetch plan;
                           repeatable; needs --subc, and binds on a session's first turn
  --max-steps N            stop the run after N model steps (reason max_steps)
  --max-output-tokens N    output cap per step (bounded by the catalog's output limit)
  --idle-timeout-ms N      provider watchdog: end the attempt `interrupted` after N ms of silence
                           (default 120000)
  --reasoning MODE         show reasoning: auto (dimmed on a terminal, hidden otherwise), dim,
                           plain or hide
  --json                   one JSON object per line: control units and display deltas
  --read                   print the session's transcript (with --json: {ordinal, mid, message})
  --demo                   run a scripted turn against a built-in mock provider in a temp state root
  --help                   this text

Repeating --session S appends a new turn to the same conversation. Ctrl-C cancels the run
(recorded as cancelled). Logs go to stderr, filtered by CK_LOG (default warn).

exit codes: 0 completed, 1 run error (error, interrupted, max_steps, paused), 2 usage or admission
refusal, 130 cancelled";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningMode {
    Auto,
    Dim,
    Plain,
    Hide,
}

#[derive(Clone, Debug)]
pub struct Args {
    pub prompt: Option<String>,
    pub model: Option<String>,
    pub variant: Option<String>,
    pub system: Option<String>,
    pub session: String,
    pub project_root: String,
    pub harness: String,
    pub state_root: Option<PathBuf>,
    pub base_url: Option<String>,
    pub auth_bearer: Option<String>,
    /// `--auth-method`: the model's provider authenticates this way.
    pub auth_method: Option<broca::catalog::route::AuthMethod>,
    /// `--code-assist-project`.
    pub code_assist_project: Option<String>,
    pub subc: Option<PathBuf>,
    /// `(module, preset)` per `--tool-provider`.
    pub tool_providers: Vec<(String, Option<String>)>,
    pub max_steps: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub idle_timeout_ms: u64,
    pub reasoning: ReasoningMode,
    pub json: bool,
    pub read: bool,
    pub demo: bool,
}

pub enum Parsed {
    Run(Box<Args>),
    Help,
}

fn positive(flag: &str, v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} takes a positive whole number, not {v:?}")),
    }
}

pub fn parse(argv: impl Iterator<Item = String>) -> Result<Parsed, String> {
    let cwd = std::env::current_dir().map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| "/".into());
    let mut a = Args {
        prompt: None,
        model: None,
        variant: None,
        system: None,
        session: String::new(),
        project_root: cwd,
        harness: "broca-run".into(),
        state_root: None,
        base_url: None,
        auth_bearer: None,
        auth_method: None,
        code_assist_project: None,
        subc: None,
        tool_providers: Vec::new(),
        max_steps: None,
        max_output_tokens: None,
        idle_timeout_ms: 120_000,
        reasoning: ReasoningMode::Auto,
        json: false,
        read: false,
        demo: false,
    };
    let mut argv = argv.peekable();
    while let Some(arg) = argv.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline.clone().or_else(|| argv.next()).ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--help" | "-h" => return Ok(Parsed::Help),
            "--model" => a.model = Some(value("--model")?),
            "--variant" => a.variant = Some(value("--variant")?),
            "--system" => a.system = Some(value("--system")?),
            "--session" => a.session = value("--session")?,
            "--project-root" => a.project_root = value("--project-root")?,
            "--harness" => a.harness = value("--harness")?,
            "--state-root" => a.state_root = Some(PathBuf::from(value("--state-root")?)),
            "--base-url" => a.base_url = Some(value("--base-url")?),
            "--auth-bearer" => a.auth_bearer = Some(value("--auth-bearer")?),
            "--auth-bearer-file" => a.auth_bearer = Some(bearer_file(&value("--auth-bearer-file")?)?),
            "--auth-method" => {
                let name = value("--auth-method")?;
                let method = broca::catalog::route::AuthMethod::parse(&name).ok_or_else(|| {
                    format!("--auth-method {name:?}: one of apikey, chatgpt, oauth, antigravity, sigv4")
                })?;
                a.auth_method = Some(method);
            }
            "--code-assist-project" => a.code_assist_project = Some(value("--code-assist-project")?),
            "--subc" => a.subc = Some(PathBuf::from(value("--subc")?)),
            "--tool-provider" => {
                let v = value("--tool-provider")?;
                let (module, preset) = match v.split_once(':') {
                    Some((m, p)) => (m.to_string(), Some(p.to_string())),
                    None => (v, None),
                };
                if module.is_empty() || preset.as_deref() == Some("") {
                    return Err("--tool-provider takes MODULE or MODULE:PRESET".into());
                }
                a.tool_providers.push((module, preset));
            }
            "--max-steps" => a.max_steps = Some(positive("--max-steps", &value("--max-steps")?)?),
            "--max-output-tokens" => {
                a.max_output_tokens = Some(positive("--max-output-tokens", &value("--max-output-tokens")?)?)
            }
            "--idle-timeout-ms" => a.idle_timeout_ms = positive("--idle-timeout-ms", &value("--idle-timeout-ms")?)?,
            "--reasoning" => {
                a.reasoning = match value("--reasoning")?.as_str() {
                    "auto" => ReasoningMode::Auto,
                    "dim" => ReasoningMode::Dim,
                    "plain" => ReasoningMode::Plain,
                    "hide" => ReasoningMode::Hide,
                    other => return Err(format!("--reasoning takes auto, dim, plain or hide, not {other:?}")),
                }
            }
            "--json" => a.json = true,
            "--read" => a.read = true,
            "--demo" => a.demo = true,
            "-" => a.prompt = Some("-".into()),
            f if f.starts_with('-') && f.len() > 1 => return Err(format!("unknown option {f}")),
            _ if a.prompt.is_none() => a.prompt = Some(arg),
            _ => return Err("only one PROMPT may be given (quote it)".into()),
        }
    }
    if !a.tool_providers.is_empty() && a.subc.is_none() {
        return Err("--tool-provider needs --subc (tool providers are reached through the subc daemon)".into());
    }
    if a.session.is_empty() {
        if a.read {
            return Err("--read needs --session".into());
        }
        a.session = format!("s-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    }
    Ok(Parsed::Run(Box::new(a)))
}

/// The bearer in `path`: its first line, at most 64 KiB read (never echoed in an error).
fn bearer_file(path: &str) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64 << 10).read_to_string(&mut text))
        .map_err(|e| format!("--auth-bearer-file {path}: {e}"))?;
    let token = text.lines().next().unwrap_or_default().trim().to_owned();
    if token.is_empty() {
        return Err(format!("--auth-bearer-file {path}: the file holds no credential"));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer_of(args: &[&str]) -> Result<Option<String>, String> {
        match parse(args.iter().map(|s| (*s).to_owned()))? {
            Parsed::Run(a) => Ok(a.auth_bearer.clone()),
            Parsed::Help => Ok(None),
        }
    }

    #[test]
    fn a_bearer_file_keeps_the_credential_off_the_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "sk-secret\nignored\n").unwrap();
        let path = file.to_str().unwrap();
        assert_eq!(bearer_of(&["--auth-bearer-file", path, "hi"]).unwrap().as_deref(), Some("sk-secret"));
        std::fs::write(&file, "\n").unwrap();
        let empty = bearer_of(&["--auth-bearer-file", path, "hi"]).unwrap_err();
        assert!(empty.contains("holds no credential"), "{empty}");
        assert!(bearer_of(&["--auth-bearer-file", "/nonexistent/x", "hi"]).is_err());
    }
}
