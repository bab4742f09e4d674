"""Who calls and what they may do (RFC 6, DESIGN.md section 9): principals, the rule of every
method and route, and the one pure decision over them."""
