-- The core service's role reads the preset vectors' versions: `pinlog-core reprocess
-- keywords` computes the current preset list version of the profile in use
-- (pinlog_platform/preset_list.py). A core-scope file: the role comes from 0023.
GRANT SELECT ON ai.keyword_preset_embedding TO pinlog_core_service;
