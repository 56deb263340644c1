"""HTTP layer: routes, request schemas, typed dependencies. No SQL, no logic."""
