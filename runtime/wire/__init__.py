"""Every record that crosses a process boundary (msgspec Structs), the typed queues that
carry them, and the errors the api's clients see.

Channels (each a tagged union, decoded by `runtime.wire.ipc`):
  api -> scheduler      `scheduler_input.SchedulerInput` = GenerateReq | AbortReq | FinishReq
                                            | GetStats | Shutdown | FlushCache
  scheduler -> api      `api_input.ApiInput` = BatchOut | SchedulerStats | ProcessDied | Limits
                                            | CacheFlushed
  scheduler -> worker   `worker_channel.WorkerInput` = BatchPlan | GrammarCacheUpdate | Shutdown
  worker -> scheduler   `worker_channel.WorkerOutput` = StepResult | WorkerReady | WorkerFailed
                                            | GrammarCompiled
  any -> supervisor     `lifecycle.Ready`
  RPC client <-> api    `rpc.RpcInput` = RpcGenerate | RpcAbort | RpcGetModelInfo ;
                        `rpc.RpcOutput` = RequestOutput | RpcBatch | RpcError | RpcModelInfo

`SamplingParams` (`sampling`) travels inside requests from every surface to the sampler;
`RequestOutput` (`request_output`) is a request's output on every surface. Records are
imported from the module that defines them; this package re-exports nothing.
"""
