"""Storage: every sample in a database (PostgreSQL, or SQLite as the embedded default), and a local
spool that keeps results safe while the database is away.

Modules: `models` (the schema), `engine` (engines and error descriptions), `migrate` (alembic),
`records` (pure run summaries), `repository` (reads and writes), `spool` and `writer` (nothing lost),
`cli` (`ttft-monitor db ...`). See docs/storage.md.
"""
