"""The ops-box store: Parquet files partitioned by table/date/hour, plus a view catalog.

Layout under ``store_dir`` (see docs/store.md)::

    store.json                         store schema version (refused if newer than we know)
    catalog.duckdb                     views only, over the Parquet globs (readers open it)
    <table>/date=YYYY-MM-DD/hour=H/    one directory per table and UTC hour
        c<commit>.parquet              written by one group commit of the ingest daemon
        m<lo>-<hi>.parquet             a compacted file (the commits it merged)
        r<minute>.parquet              a per-minute rollup written by the hot window
    <table>/date=1970-01-01/hour=0/_schema.parquet   empty placeholder: typed, so views
                                                      over an empty table still work
    _ingest/                           daemon state (compaction intents, memory peaks)
"""
