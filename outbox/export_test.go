package outbox

// RelayLockKey is the advisory lock key of the relay of schema (tests take it away).
var RelayLockKey = relayLockKey
