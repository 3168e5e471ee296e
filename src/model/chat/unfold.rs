//! Products that are not folded at compile time.

use minijinja::machinery::{Token, tokenize};
use minijinja::syntax::SyntaxConfig;

/// Returns 1: put between the operands of every `*` so that no product is folded at compile
/// time (see [`unfold_products`]).
pub const FOLD_STOP: &str = "__flashlm_one";

/// The source with every binary `*` made into `* __flashlm_one() *`, which computes the same
/// product (times one) but is no longer a constant expression.
///
/// minijinja folds constant expressions while it compiles, without fuel: `[x] * 2415219` folds
/// into a lazily repeated list (it costs nothing), and `~`, `==` or `in` applied to that
/// constant then build or walk all of it at compile time, before any guard runs (2 GB and
/// several seconds for one `~`). A repeated list is the one constant that can be far larger
/// than its source, and only `*` makes it. A `*` counts as binary when it follows the end of
/// an operand (a name, a literal, a closing bracket); a splat (`f(*args)`) follows `(` or `,`.
/// The scan uses minijinja's own lexer; a source that does not lex is left as it is.
pub fn unfold_products(source: &str, syntax: SyntaxConfig) -> String {
    let mut out = String::with_capacity(source.len());
    let mut at = 0;
    let mut prev: Option<Token<'_>> = None;
    for t in tokenize(source, false, syntax) {
        let Ok((tok, span)) = t else {
            return source.to_string();
        };
        let operand_ended = matches!(
            prev,
            Some(
                Token::Ident(_)
                    | Token::Str(_)
                    | Token::String(_)
                    | Token::Int(_)
                    | Token::Int128(_)
                    | Token::Float(_)
                    | Token::ParenClose
                    | Token::BracketClose
                    | Token::BraceClose
            )
        );
        if matches!(tok, Token::Mul) && operand_ended {
            let end = span.end_offset as usize;
            let Some(piece) = source.get(at..end) else {
                return source.to_string();
            };
            out.push_str(piece);
            out.push_str(&format!(" {FOLD_STOP}() *"));
            at = end;
        }
        prev = Some(tok);
    }
    match source.get(at..) {
        Some(rest) => out.push_str(rest),
        None => return source.to_string(),
    }
    out
}
