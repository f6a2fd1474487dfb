"""The broker's protocol as both ends speak it: where the broker listens (:mod:`.address`), the
framing and error encoding of requests and answers (:mod:`.protocol`), and the client
(:mod:`.client`). A package of its own below both the broker (:mod:`gpualloc.broker`, the
server) and the host it serves (:mod:`gpualloc.host.brokered`, the client side), so that
neither imports the other's side."""
