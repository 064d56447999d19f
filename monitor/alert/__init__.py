"""Alerting: notifications from incidents, routed, silenced, and delivered through a durable outbox.

The daemon's part, in full:

    metrics = AlertMetrics(registry)                       # optional
    transport = Transport()                                # one aiohttp session for every receiver
    dispatcher = Dispatcher(engine, config.alerts, transport, metrics=metrics)
    task = asyncio.create_task(dispatcher.run(stop))       # its own task; never awaited by probes
    ...
    await dispatcher.outbox.notify(notification)           # after each detector event (a DB insert)
    ...
    dispatcher.update_config(new_config.alerts)            # on SIGHUP
    stop.set(); await task; await transport.close()        # on shutdown (bounded by run's grace_s)

See docs/alerting.md for receivers, routing, silences, retries and the outbox's guarantees.
"""
