"""taccd: the tracing service (always-on aggregates, on-demand captures). docs/taccd.md."""
