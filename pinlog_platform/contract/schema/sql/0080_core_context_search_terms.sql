-- The lexical index of personal search (docs/search.md): each context's content lemmas, written
-- in the statement that writes the context (core_service/repository/context_writes.py) and by
-- `pinlog-core reindex search` for contexts written before it or under another analyser
-- version. Built-in B-trees only (the embedded server has no pg_trgm, no btree_gin).
--   context_search_doc: one row per analysed context; term_count is the context's number of
--     content lemmas (BM25's document length), analyser_version the analyser and term rules
--     that produced its terms (pinlog_platform.search.terms.ANALYSER_VERSION).
--   context_search_term: one row per (member, lemma, context) with the lemma's count in the
--     context; the primary key is the lexical query's index (one member's rows, given terms).
-- Liveness is not stored here: the lexical query joins core.context and core.record for its
-- hits, so a deleted, replaced or record-deleted context (or a withdrawn member's) is never
-- matched; BM25's statistics count every analysed version of the member's notes.
CREATE TABLE IF NOT EXISTS core.context_search_doc (
    context_id       BIGINT       PRIMARY KEY REFERENCES core.context (id) ON DELETE CASCADE,
    member_id        BIGINT       NOT NULL,
    analyser_version VARCHAR(100) NOT NULL,
    term_count       INT          NOT NULL CHECK (term_count >= 0)
);
-- The lexical query's collection statistics: an index-only scan of one member's rows.
CREATE INDEX IF NOT EXISTS context_search_doc_member_idx
    ON core.context_search_doc (member_id) INCLUDE (term_count);

CREATE TABLE IF NOT EXISTS core.context_search_term (
    member_id  BIGINT      NOT NULL,
    term       VARCHAR(64) NOT NULL,
    context_id BIGINT      NOT NULL
        REFERENCES core.context_search_doc (context_id) ON DELETE CASCADE,
    tf         INT         NOT NULL CHECK (tf > 0),
    PRIMARY KEY (member_id, term, context_id)
);
-- The cascade from context_search_doc looks terms up by context.
CREATE INDEX IF NOT EXISTS context_search_term_context_idx
    ON core.context_search_term (context_id);

-- The core writes terms with a context; `reindex search` replaces a context's terms.
GRANT SELECT, INSERT, UPDATE, DELETE
    ON core.context_search_doc, core.context_search_term TO pinlog_core_service;
