import fc from "fast-check"
const s = fc.sample(fc.string({ unit: "binary", minLength: 50, maxLength: 50 }), 200).join("")
console.log(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(s), s.length)
const d = fc.sample(fc.dictionary(fc.constantFrom("__proto__", "a"), fc.nat()), 30)
console.log(d.filter((o) => Object.hasOwn(o, "__proto__")).length, d.filter((o) => Object.getPrototypeOf(o) !== Object.prototype).length)
