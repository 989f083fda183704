"""Sans-IO AMQP 1.0 wire layer: protocol headers, frames, performatives, conditions.

No sockets, no asyncio, no policy. proton is imported only by :mod:`.codec`.
"""
