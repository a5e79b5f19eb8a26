"""``conductor lake view``: a local web page over one or more lakes (runs, trajectories, one workflow as a graph,
two runs compared, training curves), read through DuckDB with server-side paging. See docs/lake-view.md."""
