// vtk.js's mesh XML reader (never used by a 2-D stack viewport) requires Node's `events` and `url`.
export class EventEmitter {}
export class URL {}
export default { EventEmitter, URL };
