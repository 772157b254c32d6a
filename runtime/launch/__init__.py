"""Starting a server: the `sluice` command (`cli`), one server's processes (`server`,
`process_group`, `server_process`) and data-parallel replicas behind a router
(`data_parallel`). Modules are imported by name; this package re-exports nothing."""
