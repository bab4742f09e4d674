"""Human in the loop (RFC 15): the invocation machine, its vocabulary, the deployment policy,
the checks of a request's fields and the invocation and decision payloads."""
