"""The api process's view of the server: Prometheus metrics (`metrics`), what `/health`
answers (`health`), and the stats poll and log lines that feed both (`monitor`)."""
