"""Authentication at the coordinator's edge: every call on every surface resolves to one
principal (mTLS certificates, API keys, operator tokens, per-call agent proofs) before any
handler runs; the decision itself is core/access."""
