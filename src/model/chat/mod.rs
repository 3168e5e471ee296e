//! Chat prompts: renders a model's `tokenizer.chat_template` (Jinja) with minijinja.
//!
//! Templates written for Hugging Face expect `messages` (a list of `{role, content}` maps),
//! `add_generation_prompt`, `bos_token`, `eos_token` and a `raise_exception(message)` function,
//! and are rendered with `trim_blocks` and `lstrip_blocks`. A few common Python string and dict
//! methods (`strip`, `startswith`, `items`, ...) are provided because templates call them.
//!
//! A template comes from the model file, so it is untrusted code:
//! - it cannot reach anything outside the render: minijinja is built without `include`,
//!   `import` and `extends` (they do not parse), no loader is set, and no function or method
//!   touches files, the environment or the network;
//! - each render has a fuel budget ([`render_fuel`]) that bounds both the instructions run and
//!   the bytes created (loops, string repetition, concatenation, `replace`, ...), and a
//!   recursion limit ([`RECURSION_LIMIT`]); going past either fails with a typed error;
//! - the template source is at most [`MAX_TEMPLATE_BYTES`];
//! - a namespace cannot be made to contain itself (which minijinja would walk without end
//!   wherever the value is printed, compared or serialized): every `{% set ns.attr = value %}`
//!   checks that `value` does not lead back to `ns` (see `acyclic`);
//! - every single instruction that walks a whole value (printing it, `~`, comparing, hashing,
//!   unpacking, filters and tests that read more than a value's surface, `tojson`) first walks
//!   it as far as the remaining fuel can pay and charges that walk (see `bounded`): a value far
//!   larger than it cost to build (a list repeated lazily, a list holding another twice,
//!   doubled in a loop) fails with [`ChatError::OutOfFuel`] instead of taking minutes or all
//!   memory. For this the template is compiled with minijinja's own parser and code
//!   generator, and guard calls are put in front of those instructions; names starting with
//!   `__flashlm` are reserved for them;
//! - `flashlm chat` and `serve` also render in a [`Sandbox`], a child process with a memory
//!   limit and a deadline, as a second wall.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};
use thiserror::Error;

use crate::gguf::{GgufError, GgufFile};

mod acyclic;
mod bounded;
mod methods;
pub mod sandbox;
mod unfold;

use methods::{python_method, raise_exception};
pub use sandbox::Sandbox;

/// ChatML, used when a model has no `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// Deepest nesting of macro calls, loops and blocks a render may reach.
pub const RECURSION_LIMIT: usize = 100;
/// Largest accepted template source (real templates are a few KiB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;
/// Fuel every render gets whatever its input: about this many instructions, or 64 times this
/// many bytes of strings and lists created.
pub const BASE_FUEL: u64 = 200_000;
/// Extra fuel per 64 bytes of input (messages and the BOS/EOS texts): enough for a template to
/// copy its input this many times.
pub const FUEL_PER_INPUT_BLOCK: u64 = 32;

/// The most fuel any render gets, whatever its input (about 2 MB of messages reach it; no
/// context holds that much text). It also bounds how deeply a template can nest the values it
/// builds (about one level per fuel at best), and so the stack their printing, comparing and
/// freeing need: see [`RENDER_STACK`].
pub const MAX_FUEL: u64 = 500_000;

/// Stack of the thread each render runs on. minijinja prints, serializes, compares and frees
/// nested values recursively, a few hundred bytes of stack per level: a list nested 80 000
/// deep (cheap to build in a loop) needed up to 32 MiB, past the 2 MiB of a test or server
/// thread and the 8 MiB of a main thread, where it overflowed the stack and aborted the
/// process. [`MAX_FUEL`] bounds the depth to about 350 000 levels; this reserves room for them
/// (address space only: pages are touched only as deep as a render goes).
pub const RENDER_STACK: usize = 256 << 20;

/// The fuel a render of `messages` gets: [`BASE_FUEL`] plus [`FUEL_PER_INPUT_BLOCK`] per 64
/// bytes of input, at most [`MAX_FUEL`].
pub fn render_fuel(messages: &[ChatMessage], bos_token: &str, eos_token: &str) -> u64 {
    let bytes = messages
        .iter()
        .map(|m| m.role.len() as u64 + m.content.len() as u64)
        .fold(
            bos_token.len() as u64 + eos_token.len() as u64,
            u64::saturating_add,
        );
    BASE_FUEL
        .saturating_add((bytes / 64 + 1).saturating_mul(FUEL_PER_INPUT_BLOCK))
        .min(MAX_FUEL)
}

/// Everything that can go wrong while preparing or rendering a chat prompt.
#[derive(Debug, Error)]
pub enum ChatError {
    #[error("reading chat template metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("the chat template does not compile: {0:#}")]
    Syntax(#[source] Error),
    #[error("rendering the chat template failed: {0:#}")]
    Render(#[source] Error),
    #[error(
        "the chat template uses the name `{name}`: names starting with `{prefix}` are reserved"
    )]
    Reserved { name: String, prefix: &'static str },
    #[error("the chat template is {len} bytes, more than the {max} accepted")]
    TooLarge { len: usize, max: usize },
    #[error(
        "the chat template used up its fuel ({fuel}): it runs too long or builds too much text"
    )]
    OutOfFuel { fuel: u64 },
    #[error("the chat template nests deeper than {limit} levels")]
    TooDeep { limit: usize },
    #[error("rendering the chat template: {0}")]
    Thread(String),
    /// The render ran in a [`Sandbox`] and went past its memory or time limit.
    #[error("the chat template render was stopped: {0}")]
    Limit(String),
    /// The render ran in a [`Sandbox`] and failed there (the message is the child's).
    #[error("{0}")]
    Sandboxed(String),
    /// The [`Sandbox`] process could not be run, or answered nonsense.
    #[error("the chat template sandbox failed: {0}")]
    Sandbox(String),
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `"system"`, `"user"` or `"assistant"` (templates may accept others).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A compiled chat template with the BOS/EOS texts it may refer to.
pub struct ChatTemplate {
    /// Locked while rendering: each render sets its own fuel.
    env: Mutex<Environment<'static>>,
    source: String,
    /// `source` with its namespace assignments guarded (see `acyclic`): what is compiled.
    guarded: String,
    syntax: SyntaxConfig,
    bos_token: String,
    eos_token: String,
    /// Where renders run: in this process when `None`.
    sandbox: Option<Arc<Sandbox>>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles a template. `bos_token`/`eos_token` are the texts of those tokens.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, ChatError> {
        let source = source.into();
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(ChatError::TooLarge {
                len: source.len(),
                max: MAX_TEMPLATE_BYTES,
            });
        }
        if let Some(at) = source.find(bounded::RESERVED_PREFIX) {
            let name: String = source[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            return Err(ChatError::Reserved {
                name,
                prefix: bounded::RESERVED_PREFIX,
            });
        }
        let mut env = Environment::new();
        // `pprint` and `debug()` build their whole text without paying fuel (`pprint` indents,
        // so it is quadratic in the nesting depth: a value nested 20 000 deep, cheap to build,
        // took minutes). Chat templates have no use for a debugging printer.
        env.remove_filter("pprint");
        env.remove_global("debug");
        env.set_recursion_limit(RECURSION_LIMIT);
        env.set_fuel(Some(BASE_FUEL));
        // Printing and `~` measure a value before writing it (see `bounded`).
        env.set_formatter(bounded::formatter);
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(ChatError::Syntax)?;
        let unfolded = unfold::unfold_products(&source, syntax.clone());
        let guarded = acyclic::guard_assignments(&unfolded, syntax.clone());
        env.set_syntax(syntax.clone());
        env.add_function("raise_exception", raise_exception);
        env.add_function(acyclic::GUARD, acyclic::acyclic);
        bounded::add_guards(&mut env);
        env.set_unknown_method_callback(python_method);
        // Compiled once here to report syntax errors; each render compiles again (the
        // instructions borrow the source).
        bounded::compile(TEMPLATE_NAME, &guarded, syntax.clone()).map_err(ChatError::Syntax)?;
        Ok(ChatTemplate {
            env: Mutex::new(env),
            source,
            guarded,
            syntax,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            sandbox: None,
        })
    }

    /// ChatML with the given BOS/EOS texts.
    pub fn chatml(
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, ChatError> {
        Self::new(CHATML_TEMPLATE, bos_token, eos_token)
    }

    /// The template of a GGUF file (`tokenizer.chat_template`, ChatML when absent), with the
    /// texts of its BOS and EOS tokens.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, ChatError> {
        let source = gguf
            .get_str("tokenizer.chat_template")?
            .unwrap_or(CHATML_TEMPLATE)
            .to_string();
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let text_of = |key: &str| -> Result<String, ChatError> {
            let id = gguf.get_u64(key)?;
            Ok(match (id, &tokens) {
                (Some(id), Some(tokens)) => usize::try_from(id)
                    .ok()
                    .and_then(|i| tokens.get(i))
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                _ => String::new(),
            })
        };
        let bos = text_of("tokenizer.ggml.bos_token_id")?;
        let eos = text_of("tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos, eos)
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders every conversation in `sandbox`, a child process with memory and time limits,
    /// instead of in this process.
    pub fn with_sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = Some(Arc::new(sandbox));
        self
    }

    /// Renders a conversation (in the sandbox when one is set). With `add_generation_prompt`,
    /// the prompt ends with the opening of an assistant turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        match &self.sandbox {
            Some(sandbox) => sandbox.render(self, messages, add_generation_prompt),
            None => self.render_here(messages, add_generation_prompt),
        }
    }

    /// Renders a conversation in this process, whatever the sandbox setting, on a thread of
    /// its own with a [`RENDER_STACK`] stack: fuel, the paid walks and the recursion limit
    /// bound it (the [`Sandbox`] adds a memory limit and a deadline on top).
    pub fn render_here(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        // Every value the render builds is also freed on that thread.
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("chat template".into())
                .stack_size(RENDER_STACK)
                .spawn_scoped(scope, || {
                    self.render_on_this_thread(messages, add_generation_prompt)
                })
                .map_err(|e| ChatError::Thread(e.to_string()))?
                .join()
                .unwrap_or_else(|_| Err(ChatError::Thread("the render panicked".into())))
        })
    }

    /// As [`ChatTemplate::render_here`], on the calling thread: the caller provides a stack of
    /// at least [`RENDER_STACK`] (deeply nested values are printed, compared and freed
    /// recursively), e.g. a long-lived worker thread that renders many conversations.
    pub fn render_on_this_thread(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let fuel = render_fuel(messages, &self.bos_token, &self.eos_token);
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role", Value::from(m.role.as_str()));
                map.insert("content", Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let mut ctx = BTreeMap::new();
        ctx.insert("messages", Value::from(messages));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        ctx.insert("bos_token", Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token", Value::from(self.eos_token.as_str()));
        let mut env = self.env.lock().unwrap_or_else(|e| e.into_inner());
        env.set_fuel(Some(fuel));
        let env: &Environment<'_> = &env;
        let (root, blocks) = bounded::compile(TEMPLATE_NAME, &self.guarded, self.syntax.clone())
            .map_err(ChatError::Syntax)?;
        acyclic::start_render();
        let mut text = String::new();
        minijinja::machinery::eval(
            env,
            &root,
            Value::from(ctx),
            &blocks,
            &mut minijinja::machinery::make_string_output(&mut text),
            minijinja::AutoEscape::None,
        )
        .map_err(|e| render_error(e, fuel))?;
        Ok(text)
    }
}

/// Names running out of fuel and recursing too deep (anywhere in the error's chain).
fn render_error(e: Error, fuel: u64) -> ChatError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cause {
        if let Some(m) = c.downcast_ref::<Error>() {
            if m.kind() == ErrorKind::OutOfFuel {
                return ChatError::OutOfFuel { fuel };
            }
            if m.kind() == ErrorKind::InvalidOperation
                && m.detail() == Some("recursion limit exceeded")
            {
                return ChatError::TooDeep {
                    limit: RECURSION_LIMIT,
                };
            }
        }
        cause = c.source();
    }
    ChatError::Render(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template, as stored in its GGUF.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_single_turn() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t.render(&[ChatMessage::user("Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&[ChatMessage::user("Hi")], false).unwrap();
        assert!(out.ends_with("<|im_start|>user\nHi<|im_end|>\n"));
    }

    #[test]
    fn chatml_fallback_multi_turn() {
        let t = ChatTemplate::chatml("", "<|im_end|>").unwrap();
        let out = t
            .render(
                &[
                    ChatMessage::system("Be brief."),
                    ChatMessage::user("2+2?"),
                    ChatMessage::assistant("4"),
                    ChatMessage::user("Thanks"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    /// A Llama-2 style template: bos/eos variables, raise_exception, strip(), trim/lstrip blocks.
    const LLAMA2_STYLE: &str = "{% if messages[0]['role'] == 'system' %}
    {% set system = '<<SYS>>\\n' + messages[0]['content'].strip() + '\\n<</SYS>>\\n\\n' %}
    {% set messages = messages[1:] %}
{% else %}
    {% set system = '' %}
{% endif %}
{% for message in messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'].strip() + ' [/INST]' }}{% else %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}
{% endfor %}";

    #[test]
    fn llama2_style_template() {
        let t = ChatTemplate::new(LLAMA2_STYLE, "<s>", "</s>").unwrap();
        let out = t
            .render(
                &[
                    ChatMessage::system(" Be kind. "),
                    ChatMessage::user("Hi "),
                    ChatMessage::assistant("Hello!"),
                    ChatMessage::user("Bye"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<s>[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]"
        );
        let err = t
            .render(&[ChatMessage::user("a"), ChatMessage::user("b")], true)
            .unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn python_methods() {
        let src = "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'abc'.startswith(('z', 'a')) }}|\
{{ 'a,b'.split(',') | join('+') }}|{{ 'hi there'.title() }}|{{ 'aXa'.replace('a', 'b') }}|\
{{ messages[0].get('missing', 'd') }}|{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t.render(&[ChatMessage::user("q")], false).unwrap();
        assert_eq!(out, "a b|a|True|a+b|Hi There|bXb|d|content=q;role=user;");
    }

    #[test]
    fn from_gguf_falls_back_to_chatml() {
        use crate::gguf::MetaValue;
        use crate::gguf::writer::GgufWriter;
        let tokens = ["<unk>", "<s>", "</s>"];
        let mut w = GgufWriter::new();
        w.meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                tokens
                    .iter()
                    .map(|t| MetaValue::String(t.to_string()))
                    .collect(),
            ),
        );
        w.meta("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
        w.meta("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
        let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let t = ChatTemplate::from_gguf(&g).unwrap();
        assert_eq!(t.source(), CHATML_TEMPLATE);
        assert_eq!((t.bos_token(), t.eos_token()), ("<s>", "</s>"));
        assert_eq!(
            t.render(&[ChatMessage::user("Hi")], true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );

        w.meta(
            "tokenizer.chat_template",
            MetaValue::String("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".into()),
        );
        let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let t = ChatTemplate::from_gguf(&g).unwrap();
        assert_eq!(
            t.render(&[ChatMessage::user("x")], false).unwrap(),
            "<s>x</s>"
        );
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new("{% for x in %}", "", "").unwrap_err();
        assert!(matches!(err, ChatError::Syntax(_)));
    }
}
