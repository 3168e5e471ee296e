//! Sessions: save the cached tokens and their KV pages; resume a later run whose prompt shares
//! a prefix with them by loading the prefix's pages instead of computing them.

use std::path::Path;

use super::{Engine, EngineError};
use crate::kv::session::{self, SaveFault, SaveStats, Session, SessionIdentity};

impl Engine {
    /// What a session of this engine must match: the model file, the config, the KV element
    /// type and the page geometry.
    pub fn session_identity(&self) -> Result<SessionIdentity, EngineError> {
        Ok(SessionIdentity {
            model_hash: session::model_hash(&self.gguf)?,
            config: self.cfg.summary(),
            kv_type: if self.plan.kv.f16 { "f16" } else { "f32" }.to_string(),
            page_tokens: self.plan.kv.page_tokens,
            n_layers: self.cfg.n_layers as u32,
            page_bytes: self.plan.kv.page_bytes,
        })
    }

    /// Save the cached tokens and their pages to `path` (atomically: a failure leaves the
    /// previous file intact).
    pub fn save_session(&mut self, path: &Path) -> Result<SaveStats, EngineError> {
        self.save_session_with(path, None)
    }

    /// [`Engine::save_session`] with an injected fault (tests).
    pub fn save_session_with(
        &mut self,
        path: &Path,
        fault: Option<SaveFault>,
    ) -> Result<SaveStats, EngineError> {
        let id = self.session_identity()?;
        let tokens = self.seqs[0].tokens.clone();
        let mut fill = |l: u32, p: u32, dst: &mut [u8]| -> Result<(), crate::flash::SourceError> {
            let bytes = self.read_page(l as usize, p)?;
            dst.copy_from_slice(&bytes);
            Ok(())
        };
        Ok(session::save(path, &id, &tokens, &mut fill, fault)?)
    }

    /// Load the longest prefix of `prompt` that `session` holds (at most all but the last
    /// prompt token, whose logits are still needed); returns how many tokens were loaded.
    /// A session of another model or configuration is an error naming what differs.
    pub fn resume(&mut self, session: &Session, prompt: &[u32]) -> Result<usize, EngineError> {
        session.check_identity(&self.session_identity()?)?;
        let common = session
            .tokens()
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1))
            .min(self.max_ctx);
        if common == 0 {
            self.reset();
            return Ok(0);
        }
        self.place_pages(&prompt[..common], &mut |l, p, dst| {
            session.read_page(l as u32, p, dst)?;
            Ok(())
        })?;
        Ok(common)
    }
}
